"""The partui Llama as a plain torch.nn.Module (same shapes, same init, torch autograd), for
benchmarks against torch's own parallel wrappers (DDP, FSDP2 ...)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from kernels.layers.rope import apply_rope, rope_tables
from kernels.weights import init_params
from planning.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):                                    # x [B, S, dim]
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, hd = cfg.dim, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, hd
        self.wq = nn.Linear(d, cfg.heads * hd, bias=False)
        self.wk = nn.Linear(d, cfg.kv_heads * hd, bias=False)
        self.wv = nn.Linear(d, cfg.kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.heads * hd, d, bias=False)

    def forward(self, x, cos, sin):                          # x [B, S, dim]
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)      # [B, H, S, hd]
        k = self.wk(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)   # [B, KV, S, hd]
        v = self.wv(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        g = self.heads // self.kv_heads
        qg = q.reshape(b, self.kv_heads, g * s, self.head_dim)                    # [B, KV, G*S, hd]
        scores = qg @ k.transpose(-1, -2) / math.sqrt(self.head_dim)             # [B, KV, G*S, S]
        future = torch.ones(s, s, dtype=torch.bool).triu(1).repeat(g, 1)
        p = scores.masked_fill(future, float("-inf")).softmax(-1)
        o = (p @ v).reshape(b, self.heads, s, self.head_dim)                      # [B, H, S, hd]
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(cfg.dim, cfg.norm_eps), Attention(cfg)
        self.mlp_norm, self.mlp = RMSNorm(cfg.dim, cfg.norm_eps), MLP(cfg)

    def forward(self, x, cos, sin):
        h = x + self.attn(self.attn_norm(x), cos, sin)
        return h + self.mlp(self.mlp_norm(h))


class TorchLlama(nn.Module):
    """Dense only (no MoE); parameter names match partui's canonical ones."""

    def __init__(self, cfg: ModelConfig, seed: int = 0):
        super().__init__()
        if cfg.experts:
            raise ValueError("TorchLlama is the dense model: drop --experts")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        cos, sin = rope_tables(torch.arange(cfg.seq), cfg.head_dim, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        with torch.no_grad():                     # the same seeded init as the hand-written model
            tensors = init_params(cfg, seed)
            for name, prm in self.named_parameters():
                prm.copy_(tensors[name])

    def forward(self, ids, targets, denom: int):              # ids, targets [B, S]
        x = self.embed(ids)                                   # [B, S, dim]
        for blk in self.layers:
            x = blk(x, self.cos, self.sin)
        logits = self.lm_head(self.norm(x))                   # [B, S, vocab]
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum") / denom
