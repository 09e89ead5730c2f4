"""RMSNorm: y = x / rms(x) * w, with rms over the last dim."""
from __future__ import annotations

import torch

from kernels.layers.base import Ctx, Layer, Param


class RMSNorm(Layer):
    def __init__(self, weight: Param, eps: float = 1e-5):
        self.weight, self.eps = weight, eps

    def own_params(self):
        return {"weight": self.weight}

    def forward(self, x):                                           # x [..., dim]
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)  # [..., 1]
        xhat = x * rstd
        return xhat * self.weight.data, Ctx(xhat=xhat, rstd=rstd)

    def drop_recomputable(self, ctx):
        """Selective recompute: xhat and rstd go; the caller keeps the input x to rebuild them."""
        ctx.xhat = ctx.rstd = None

    def rebuild_from(self, ctx, x):
        """xhat and rstd again from the input x (the forward's own ops: the same bits); returns
        the output, which the caller hands back to the linears that saved it."""
        y, full = self.forward(x)
        ctx.xhat, ctx.rstd = full.xhat, full.rstd
        return y

    def backward_input(self, ctx, dy):
        ctx.dy = dy
        g = dy * self.weight.data                                   # d/d(xhat)
        # d xhat / dx projects out the component along xhat (rms is scale-invariant)
        return ctx.rstd * (g - ctx.xhat * (g * ctx.xhat).mean(-1, keepdim=True))

    def backward_weight(self, ctx):
        d = ctx.dy.shape[-1]
        self.weight.accumulate((ctx.dy * ctx.xhat).reshape(-1, d).sum(0))
        ctx.xhat = ctx.dy = None
