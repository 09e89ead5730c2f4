"""An independent oracle: the tiny Llama written with torch's own modules and autograd (nn.Embedding,
nn.RMSNorm, nn.Linear, F.scaled_dot_product_attention, F.cross_entropy) stepped by torch.optim
(AdamW or SGD), and for MoE models the GShard or DeepSeek-V3 block of kernels/torch_moe.py
(dense layers mixed in by moe_every). It shares only the initial weights (kernels.weights) and the data (kernels.data) with
partui, so `--check --reference autograd` proves the math, not just the split across ranks: the
hand reference (kernels.check.Reference) runs the same layers as the plans and cannot see a wrong
kernel they share.

Same interface as kernels.check.Reference: forward_backward() -> (loss, {name: grad}) at the current
params, update(grads) -> {name: param} after the optimizer step (and DeepSeek's bias step from this
model's own loads), `routing` -> the step's routing counts per MoE layer. fp32 only: see
partui.world.plans.check_reference for why bf16 plans keep the hand reference.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.data import global_batch
from kernels.torch_moe import MoEBlock, SwiGLU
from kernels.weights import init_params
from planning.config import is_moe_layer, model_config_for


def rotate(x, cos, sin):
    """RoPE, rotate-half form (the convention of Llama's reference code)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        hd = cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, hd
        self.wq = nn.Linear(cfg.dim, cfg.heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.heads * hd, cfg.dim, bias=False)

    def forward(self, x, cos, sin):                            # x [B, S, dim]
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)    # [B, H, S, hd]
        k = self.wk(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v,
                                           is_causal=True, enable_gqa=True)     # [B, H, S, hd]
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    """Attention and an MLP, each behind an RMSNorm and a residual. The MLP is partui's naming:
    `mlp` (SwiGLU) in a dense layer, `moe` (kernels/torch_moe.py) where is_moe_layer says."""

    def __init__(self, cfg, index: int):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        if is_moe_layer(cfg, index):
            self.moe = MoEBlock(cfg, index)
        else:
            self.mlp = SwiGLU(cfg.dim, cfg.ffn_hidden)

    @property
    def ffn(self):
        return getattr(self, "moe", None) or self.mlp

    def forward(self, x, cos, sin):
        h = x + self.attn(self.attn_norm(x), cos, sin)
        return h + self.ffn(self.mlp_norm(h))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64)
                                       / cfg.head_dim)
        ang = torch.arange(cfg.seq, dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=-1)                    # [S, hd]
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, ids, targets):                           # ids, targets [B, S]
        x = self.embed(ids)
        for block in self.layers:
            x = block(x, self.cos, self.sin)
        logits = self.lm_head(self.norm(x))                    # [B, S, vocab]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return loss + sum(moe.last["aux"] for moe in self.moes())   # + each MoE's balance loss

    def moes(self) -> list[MoEBlock]:
        return [blk.moe for blk in self.layers if hasattr(blk, "moe")]


class TorchReference:
    """The torch-module model in one process, trained on partui's global batches (fp32)."""

    def __init__(self, plan, cfg, seed=0, optim="adamw", lr=None, weight_decay=None):
        self.cfg = model_config_for(plan, cfg)
        self.seed, self.step_count = seed, 0
        self.routing: dict = {}        # the last step's routing counts per MoE layer (index -> ...)
        self.model = Llama(self.cfg)
        self.params = dict(self.model.named_parameters())
        with torch.no_grad():                                  # partui's seeded initial weights
            for name, tensor in init_params(self.cfg, seed, torch.float32).items():
                self.params[name].copy_(tensor)
        if optim == "adamw":
            self.optimizer = torch.optim.AdamW(self.params.values(), lr=1e-3 if lr is None else lr,
                                               betas=(0.9, 0.95), eps=1e-8,
                                               weight_decay=0.01 if weight_decay is None
                                               else weight_decay)
        elif optim == "sgd":
            self.optimizer = torch.optim.SGD(self.params.values(), lr=0.1 if lr is None else lr,
                                             weight_decay=weight_decay or 0.0)
        else:
            raise ValueError(f"unknown optimizer {optim!r}: pick adamw or sgd")

    def forward_backward(self):
        """(loss, {name: full grad}) of the next step at the current params."""
        ids, targets = global_batch(self.cfg.batch, self.cfg.seq, self.cfg.vocab, self.seed,
                                    self.step_count)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.model(ids, targets)
        loss.backward()
        self.routing = {str(moe.index): moe.figures() for moe in self.model.moes()}
        return loss.item(), {n: p.grad.clone() for n, p in self.params.items()}

    def update(self, grads: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """torch.optim's step from `grads` (full tensors by name) when given, else the model's own."""
        if grads is not None:
            for n, p in self.params.items():
                p.grad = grads[n].to(p.dtype).clone()
        self.optimizer.step()
        for moe in self.model.moes():   # DeepSeek's bias: state moved by its own load, not a grad
            moe.balance()
        self.step_count += 1
        return {n: p.detach() for n, p in self.params.items()}
