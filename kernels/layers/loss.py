"""Softmax cross-entropy over the vocabulary, stable (max subtracted)."""
from __future__ import annotations

import torch

from kernels.layers.base import Ctx


class CrossEntropy:
    """loss = sum over tokens of -log softmax(logits)[target] / denom.

    `denom` is the number of tokens in the *global* batch, so the partial losses of every
    microbatch and data-parallel rank add up to the global mean, and their gradients sum exactly.
    """

    def forward(self, logits, targets, denom):   # logits [N, V], targets [N]
        m = logits.max(-1, keepdim=True).values
        z = logits - m
        lse = torch.log(torch.exp(z).sum(-1, keepdim=True))   # [N, 1]
        logp_t = z.gather(-1, targets[:, None]) - lse          # [N, 1]
        loss = -logp_t.sum() / denom
        return loss, Ctx(z=z, lse=lse, targets=targets, denom=denom)

    def backward_input(self, ctx, dloss=1.0):
        g = torch.exp(ctx.z - ctx.lse)                          # softmax [N, V]
        g.scatter_add_(-1, ctx.targets[:, None], -torch.ones_like(ctx.lse))
        ctx.z = None
        return g * (dloss / ctx.denom)
