"""SwiGLU MLP: y = w2(silu(w1 x) * w3 x)."""
from __future__ import annotations

import torch

from kernels.layers.base import Ctx, Layer


class SwiGLU(Layer):
    def __init__(self, w1, w3, w2):
        self.w1, self.w3, self.w2 = w1, w3, w2   # gate, up (column-like), down (row-like)

    def sublayers(self):
        return {"w1": self.w1, "w3": self.w3, "w2": self.w2}

    def forward(self, x):                        # x [..., dim]
        h1, c1 = self.w1.forward(x)              # [..., hidden]
        h3, c3 = self.w3.forward(x)
        sig = torch.sigmoid(h1)
        act = h1 * sig                           # silu
        y, c2 = self.w2.forward(act * h3)        # [..., dim]
        return y, Ctx(c1=c1, c3=c3, c2=c2, h1=h1, h3=h3, sig=sig, act=act)

    def drop_recomputable(self, ctx):
        """Selective recompute: sig, act and w2's input act * h3 go; h1 and h3 (matmul outputs)
        stay."""
        ctx.sig = ctx.act = ctx.c2.x = None

    def rebuild_recomputable(self, ctx):
        ctx.sig = torch.sigmoid(ctx.h1)
        ctx.act = ctx.h1 * ctx.sig
        ctx.c2.x = ctx.act * ctx.h3              # [..., hidden]

    def saved_input(self, ctx):
        """The input w1 and w3 saved (one tensor)."""
        return ctx.c1.x

    def set_saved_input(self, ctx, x):
        ctx.c1.x = ctx.c3.x = x

    def backward_input(self, ctx, dy):
        da = self.w2.backward_input(ctx.c2, dy)
        dsilu = ctx.sig * (1 + ctx.h1 * (1 - ctx.sig))   # d silu(z) / dz
        dh1 = da * ctx.h3 * dsilu
        dh3 = da * ctx.act
        ctx.h1 = ctx.h3 = ctx.sig = ctx.act = None
        return self.w1.backward_input(ctx.c1, dh1) + self.w3.backward_input(ctx.c3, dh3)

    def backward_weight(self, ctx):
        self.w1.backward_weight(ctx.c1)
        self.w3.backward_weight(ctx.c3)
        self.w2.backward_weight(ctx.c2)
