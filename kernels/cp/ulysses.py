"""Ulysses (DeepSpeed) context parallelism: all-to-all from sequence shards to head shards, causal
attention over the whole sequence on the local heads, and the reverse all-to-all.
"""
from __future__ import annotations

import torch

from kernels import comm
from kernels.cp.attention_cost import AttentionLoad, attention_flops, hand_backward_only
from kernels.layers import Ctx
from kernels.layers.attention import attention_block_backward, attention_block_forward


class UlyssesAttention:
    """All-to-all from sequence shards [B, H, S/N, hd] to head shards [B, H/N, S, hd], causal
    attention over the whole sequence on the local heads, and the reverse all-to-all.
    Contiguous heads per rank keep grouped-query pairs together (H/N = G x KV/N)."""

    def __init__(self, group: comm.Group, seq: int, load: AttentionLoad, layer: int = 0):
        self.group, self.layer, self.load = group, layer, load
        self.positions = torch.arange(seq)

    def _check(self, h: int, kv: int) -> None:
        n = self.group.size
        if h % n or kv % n:
            raise ValueError(f"Ulysses splits heads over cp {n}: this rank has {h} heads and {kv} "
                             f"kv heads, which must be divisible by {n}; pick cp dividing both "
                             f"(with tp, per tp rank) or use cp_mode=ring")

    def _seq_to_heads(self, t):                  # [B, X, S/N, hd] -> [B, X/N, S, hd]
        n = self.group.size
        b, x, s, d = t.shape
        send = t.reshape(b, n, x // n, s, d).transpose(0, 1).contiguous()  # [N, B, X/N, S/N, hd]
        recv = torch.empty_like(send)                                       # [N(src), ...]
        h = comm.all_to_all_single(recv, send, self.group, async_op=True)
        # [N(src), B, X/N, S/N, hd] -> [B, X/N, S, hd]
        return h, lambda: recv.permute(1, 2, 0, 3, 4).reshape(b, x // n, n * s, d)

    def _heads_to_seq(self, t):                  # [B, X/N, S, hd] -> [B, X, S/N, hd]
        n = self.group.size
        b, x, s, d = t.shape
        send = t.reshape(b, x, n, s // n, d)                                # [B, X/N, N, S/N, hd]
        send = send.permute(2, 0, 1, 3, 4).contiguous()                     # [N, B, X/N, S/N, hd]
        recv = torch.empty_like(send)                                       # [N(head group), ...]
        h = comm.all_to_all_single(recv, send, self.group, async_op=True)
        return h, lambda: recv.transpose(0, 1).reshape(b, n * x, s // n, d)  # [B, X, S/N, hd]

    def _all(self, tensors, fn):
        """Issue every all-to-all before waiting on any, then assemble the results."""
        issued = [fn(t) for t in tensors]
        for h, _ in issued:
            h.wait()
        return [make() for _, make in issued]

    def forward(self, q, k, v):
        hand_backward_only(q)
        self._check(q.shape[1], k.shape[1])
        qh, kh, vh = self._all((q, k, v), self._seq_to_heads)          # [B, H/N, S, hd] ...
        b, h, s, d = qh.shape
        flops = attention_flops(b, h, s, s, d, backward=False)
        with self.load.block("ulysses attention", flops, layer=self.layer):
            self.positions = self.positions.to(q.device)
            o, lse, p = attention_block_forward(qh, kh, vh, self.positions, self.positions)
        self.load.report("ulysses")
        (out,) = self._all((o,), self._heads_to_seq)                   # [B, H, S/N, hd]
        return out, Ctx(q=qh, k=kh, v=vh, o=o, lse=lse, p=p)

    def drop_recomputable(self, ctx):
        """Selective recompute: the probabilities go; the backward rebuilds them from q, k and
        the log-sum-exp (attention_block_backward without probs)."""
        ctx.p = None

    def backward(self, ctx, do):
        (doh,) = self._all((do,), self._seq_to_heads)                  # [B, H/N, S, hd]
        b, h, s, d = doh.shape
        with self.load.block("ulysses attention backward", attention_flops(b, h, s, s, d, True),
                             layer=self.layer):
            dq, dk, dv = attention_block_backward(ctx.q, ctx.k, ctx.v, ctx.o, ctx.lse, doh,
                                                  self.positions, self.positions, probs=ctx.p)
        self.load.report("ulysses")
        ctx.q = ctx.k = ctx.v = ctx.o = ctx.p = None
        return tuple(self._all((dq, dk, dv), self._heads_to_seq))     # [B, H|KV, S/N, hd]
