"""Vocab-parallel cross-entropy: each tp rank holds the logits of its vocabulary slice only.

The softmax needs three numbers per token from the whole vocabulary: the max (stability), the
sum of exps and the target's logit. They are all-reduced over tp (the last two in one op, as a
[tokens, 2] tensor), so the full logits [tokens, vocab] never exist on any rank. Every tp rank
ends with the same loss; the gradient of its logit slice needs no communication at all.
"""
from __future__ import annotations

import torch

from kernels import comm
from kernels.layers.base import Ctx
from kernels.tp.regions import ReduceFromTP


class VocabParallelCrossEntropy:
    """loss = sum over tokens of (lse - logit[target]) / denom, logits split by vocab over tp."""

    def __init__(self, group: comm.Group, vocab_start: int, vocab_stop: int):
        self.group, self.vocab_start, self.vocab_stop = group, vocab_start, vocab_stop

    def forward(self, logits, targets, denom):     # logits [N, V/tp] (this rank's), targets [N]
        m = logits.max(-1, keepdim=True).values.detach().clone()   # [N, 1]
        comm.all_reduce(m, self.group, op="max")   # global max: no rank's exp can overflow
        z = logits - m                              # [N, V/tp]
        local_t = targets - self.vocab_start
        inside = (local_t >= 0) & (local_t < self.vocab_stop - self.vocab_start)  # [N]
        local_t = torch.where(inside, local_t, torch.zeros_like(local_t))
        z_t = z.gather(-1, local_t[:, None]) * inside[:, None].to(z.dtype)       # [N, 1]
        stats = torch.cat([torch.exp(z).sum(-1, keepdim=True), z_t], dim=-1)    # [N, 2]
        # sum-exp and target logit over the vocab: Megatron's g (all-reduce forward, identity
        # backward), so `backward=autograd` differentiates through it as one op (each rank's part
        # of the sum enters with weight 1) instead of torch's "silently incorrect" fallback
        stats = ReduceFromTP(self.group).forward(stats)[0]
        lse = torch.log(stats[:, :1])               # [N, 1]
        loss = (lse - stats[:, 1:]).sum() / denom
        return loss, Ctx(z=z, lse=lse, local_t=local_t, inside=inside, denom=denom)

    def backward_input(self, ctx, dloss=1.0):
        g = torch.exp(ctx.z - ctx.lse)              # this slice of the softmax [N, V/tp]
        # the -1 at the target lands only on the rank whose slice holds it
        g.scatter_add_(-1, ctx.local_t[:, None], -ctx.inside[:, None].to(g.dtype))
        ctx.z = None
        return g * (dloss / ctx.denom)
