"""Linear (no bias) and Embedding, forward and hand-written backward."""
from __future__ import annotations

import torch

from kernels.layers.base import Ctx, Layer, Param


class Linear(Layer):
    """y = x @ W^T with W [out, in]."""

    def __init__(self, weight: Param):
        self.weight = weight

    def own_params(self):
        return {"weight": self.weight}

    def forward(self, x):                       # x [..., in]
        return x @ self.weight.data.t(), Ctx(x=x)   # [..., out]

    def backward_input(self, ctx, dy):          # dy [..., out]
        ctx.dy = dy
        return dy @ self.weight.data            # [..., in]

    def backward_weight(self, ctx):
        x2 = ctx.x.reshape(-1, ctx.x.shape[-1])     # [tokens, in]
        dy2 = ctx.dy.reshape(-1, ctx.dy.shape[-1])  # [tokens, out]
        self.weight.accumulate_matmul(dy2.t(), x2)  # [out, in]
        ctx.x = ctx.dy = None                       # free activations once W is done


class Embedding(Layer):
    """y = W[ids] with W [vocab, dim]; `vocab_start` offsets ids for a vocab-parallel shard."""

    def __init__(self, weight: Param, vocab_start: int = 0):
        self.weight = weight
        self.vocab_start = vocab_start

    def own_params(self):
        return {"weight": self.weight}

    def forward(self, ids):                     # ids [batch, seq] int64
        w = self.weight.data
        local = ids - self.vocab_start
        inside = (local >= 0) & (local < w.shape[0])
        local = torch.where(inside, local, torch.zeros_like(local))
        y = w[local] * inside.unsqueeze(-1).to(w.dtype)  # [batch, seq, dim]; zero outside the shard
        return y, Ctx(local=local, inside=inside)

    def backward_input(self, ctx, dy):          # ids carry no gradient
        ctx.dy = dy
        return None

    def backward_weight(self, ctx):
        w = self.weight.data
        dy = ctx.dy.reshape(-1, w.shape[1]) * ctx.inside.reshape(-1, 1).to(ctx.dy.dtype)
        dw = torch.zeros_like(w).index_add_(0, ctx.local.reshape(-1), dy.to(w.dtype))
        self.weight.accumulate(dw)
        ctx.dy = None
