"""Causal grouped-query attention: the core (softmax(QK^T)V with its log-sum-exp) and the layer.

The core works on one block of queries against one block of keys, masked by true positions, and
returns the log-sum-exp, so context parallelism can merge blocks and reuse the same backward.
Heads h = kv * G + g share kv head `kv` (G = heads / kv_heads), as repeat_interleave would.
"""
from __future__ import annotations

import math

import torch

from kernels.layers.base import Ctx, Layer
from kernels.layers.rope import apply_rope, apply_rope_backward


def _group(q, n_kv):                      # [B, H, S, hd] -> [B, KV, G*S, hd]
    b, h, s, d = q.shape
    return q.reshape(b, n_kv, (h // n_kv) * s, d)


def _mask(q_pos, k_pos, groups):
    """True where a key lies in the query's future; rows repeat per group of heads."""
    if q_pos is None:
        return None
    return (k_pos[None, :] > q_pos[:, None]).repeat(groups, 1)  # [G*Sq, Sk]


def attention_block_forward(q, k, v, q_pos=None, k_pos=None, scale=None, keep_probs=True):
    """q [B, H, Sq, hd], k/v [B, KV, Sk, hd]; positions [Sq], [Sk] (None: no mask).
    Returns o [B, H, Sq, hd], lse [B, H, Sq] (-inf where a row sees no key), probs or None."""
    b, h, sq, d = q.shape
    n_kv = k.shape[1]
    scale = scale if scale is not None else 1.0 / math.sqrt(d)
    s = (_group(q, n_kv) @ k.transpose(-1, -2)) * scale       # [B, KV, G*Sq, Sk]
    m = _mask(q_pos, k_pos, h // n_kv)
    if m is not None:
        s = s.masked_fill(m, float("-inf"))
    lse = torch.logsumexp(s, dim=-1, keepdim=True)             # [B, KV, G*Sq, 1]
    p = torch.exp(s - lse.clamp_min(torch.finfo(s.dtype).min))  # fully masked rows -> 0
    o = (p @ v).reshape(b, h, sq, d)                           # [B, H, Sq, hd]
    return o, lse.reshape(b, h, sq), (p if keep_probs else None)


def attention_block_backward(q, k, v, o, lse, do, q_pos=None, k_pos=None, scale=None, probs=None):
    """Gradients of one block given the *final* (merged) o and lse, flash-attention style:
    dS = P * (dP - rowsum(dO * O)). Returns dq [B,H,Sq,hd], dk, dv [B,KV,Sk,hd]."""
    b, h, sq, d = q.shape
    n_kv = k.shape[1]
    scale = scale if scale is not None else 1.0 / math.sqrt(d)
    qg, dog = _group(q, n_kv), _group(do, n_kv)                 # [B, KV, G*Sq, hd]
    if probs is None:                                          # recompute them from the final lse
        lse_g = lse.reshape(b, n_kv, -1, 1)                    # [B, KV, G*Sq, 1]
        s = (qg @ k.transpose(-1, -2)) * scale
        m = _mask(q_pos, k_pos, h // n_kv)
        if m is not None:
            s = s.masked_fill(m, float("-inf"))
        probs = torch.exp(s - lse_g.clamp_min(torch.finfo(s.dtype).min))
    dv = probs.transpose(-1, -2) @ dog                         # [B, KV, Sk, hd]
    dp = dog @ v.transpose(-1, -2)                             # [B, KV, G*Sq, Sk]
    delta = (dog * _group(o, n_kv)).sum(-1, keepdim=True)      # [B, KV, G*Sq, 1]
    ds = (dp - delta).mul_(probs).mul_(scale)                  # in place: dp is not needed again
    dq = (ds @ k).reshape(b, h, sq, d)
    dk = ds.transpose(-1, -2) @ qg                             # [B, KV, Sk, hd]
    return dq, dk, dv


class LocalAttention:
    """The attention core when a rank holds the whole sequence: one causal block. Nothing merges
    its result, so it skips the log-sum-exp: the causal mask is an additive bias folded into the
    scores' matmul, and the probabilities come from one softmax (kept for the backward)."""

    def __init__(self, positions: torch.Tensor):
        self.positions = positions
        self._bias = {}                                        # (groups, dtype) -> [G*S, S]

    def bias(self, groups: int, dtype) -> torch.Tensor:
        key = (groups, dtype)
        if key not in self._bias:
            zero = torch.zeros(len(self.positions), len(self.positions), dtype=dtype)
            self._bias[key] = zero.masked_fill(_mask(self.positions, self.positions, 1), float("-inf")
                                               ).repeat(groups, 1)   # [G*S, S]: -inf in the future
        return self._bias[key]

    def forward(self, q, k, v):                                # q [B, H, S, hd], k/v [B, KV, S, hd]
        b, h, s, d = q.shape
        n_kv = k.shape[1]
        qg = _group(q, n_kv).reshape(b * n_kv, -1, d)          # [B*KV, G*S, hd]
        kf, vf = k.reshape(b * n_kv, s, d), v.reshape(b * n_kv, s, d)   # [B*KV, S, hd]
        scores = torch.baddbmm(self.bias(h // n_kv, q.dtype), qg, kf.transpose(1, 2),
                               alpha=1.0 / math.sqrt(d))       # [B*KV, G*S, S]
        p = torch.softmax(scores, dim=-1)
        o = torch.bmm(p, vf).reshape(b, h, s, d)               # [B, H, S, hd]
        return o, Ctx(q=q, k=k, v=v, o=o, p=p.view(b, n_kv, -1, s))

    def drop_recomputable(self, ctx):
        """Selective recompute: the probabilities [B, KV, G*S, S] go; q and k stay."""
        ctx.p = None

    def rebuild_recomputable(self, ctx):
        """The probabilities again from q and k, by the forward's own ops (the same bits)."""
        b, h, s, d = ctx.q.shape
        n_kv = ctx.k.shape[1]
        qg = _group(ctx.q, n_kv).reshape(b * n_kv, -1, d)     # [B*KV, G*S, hd]
        kf = ctx.k.reshape(b * n_kv, s, d)                     # [B*KV, S, hd]
        scores = torch.baddbmm(self.bias(h // n_kv, ctx.q.dtype), qg, kf.transpose(1, 2),
                               alpha=1.0 / math.sqrt(d))       # [B*KV, G*S, S]
        ctx.p = torch.softmax(scores, dim=-1).view(b, n_kv, -1, s)

    def backward(self, ctx, do):
        dq, dk, dv = attention_block_backward(ctx.q, ctx.k, ctx.v, ctx.o, None, do, probs=ctx.p)
        ctx.q = ctx.k = ctx.v = ctx.o = ctx.p = None
        return dq, dk, dv


class Attention(Layer):
    """x -> wq/wk/wv -> RoPE -> core -> wo. Head counts are the local ones (tensor parallel)."""

    def __init__(self, wq, wk, wv, wo, n_heads, n_kv_heads, head_dim, cos, sin, core):
        self.wq, self.wk, self.wv, self.wo = wq, wk, wv, wo
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.cos, self.sin, self.core = cos, sin, core

    def sublayers(self):
        return {"wq": self.wq, "wk": self.wk, "wv": self.wv, "wo": self.wo}

    def _heads(self, t, n):                    # [B, S, n*hd] -> [B, n, S, hd]
        b, s, _ = t.shape
        return t.reshape(b, s, n, self.head_dim).transpose(1, 2)

    def forward(self, x):                      # x [B, S, dim]
        q, cq = self.wq.forward(x)
        k, ck = self.wk.forward(x)
        v, cv = self.wv.forward(x)
        q = apply_rope(self._heads(q, self.n_heads), self.cos, self.sin)     # [B, H, S, hd]
        k = apply_rope(self._heads(k, self.n_kv_heads), self.cos, self.sin)  # [B, KV, S, hd]
        v = self._heads(v, self.n_kv_heads)
        o, ccore = self.core.forward(q, k, v)                                # [B, H, S, hd]
        b, h, s, d = o.shape
        y, co = self.wo.forward(o.transpose(1, 2).reshape(b, s, h * d))      # [B, S, dim]
        return y, Ctx(cq=cq, ck=ck, cv=cv, ccore=ccore, co=co)

    def drop_recomputable(self, ctx):
        """Selective recompute: what the core can rebuild (LocalAttention: the probabilities;
        the context parallel cores keep none: they recompute them in their backward anyway)."""
        getattr(self.core, "drop_recomputable", lambda c: None)(ctx.ccore)

    def rebuild_recomputable(self, ctx):
        getattr(self.core, "rebuild_recomputable", lambda c: None)(ctx.ccore)

    def saved_input(self, ctx):
        """The input wq, wk and wv saved (one tensor)."""
        return ctx.cq.x

    def set_saved_input(self, ctx, x):
        ctx.cq.x = ctx.ck.x = ctx.cv.x = x

    def backward_input(self, ctx, dy):
        do = self.wo.backward_input(ctx.co, dy)                              # [B, S, H*hd]
        b, s, _ = do.shape
        do = do.reshape(b, s, self.n_heads, self.head_dim).transpose(1, 2)   # [B, H, S, hd]
        dq, dk, dv = self.core.backward(ctx.ccore, do)
        dq = apply_rope_backward(dq, self.cos, self.sin).transpose(1, 2).reshape(b, s, -1)
        dk = apply_rope_backward(dk, self.cos, self.sin).transpose(1, 2).reshape(b, s, -1)
        dv = dv.transpose(1, 2).reshape(b, s, -1)
        return (self.wq.backward_input(ctx.cq, dq) + self.wk.backward_input(ctx.ck, dk)
                + self.wv.backward_input(ctx.cv, dv))

    def backward_weight(self, ctx):
        for lin, c in ((self.wq, ctx.cq), (self.wk, ctx.ck), (self.wv, ctx.cv), (self.wo, ctx.co)):
            lin.backward_weight(c)
