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

    def backward_input(self, ctx, dy):
        ctx.dy = dy
        g = dy * self.weight.data                                   # d/d(xhat)
        # d xhat / dx projects out the component along xhat (rms is scale-invariant)
        return ctx.rstd * (g - ctx.xhat * (g * ctx.xhat).mean(-1, keepdim=True))

    def backward_weight(self, ctx):
        d = ctx.dy.shape[-1]
        self.weight.accumulate((ctx.dy * ctx.xhat).reshape(-1, d).sum(0))
        ctx.xhat = ctx.dy = None
