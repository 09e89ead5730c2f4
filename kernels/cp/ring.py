"""Ring attention (contiguous or zigzag layout) and the all-gather baseline, forward and backward
by hand.

Ring, at step i rank r holds the K/V block of rank src = r - i (mod N). It posts the send of that
block to the next rank and the receive of the following one before computing on it, so the
transfer runs behind the block compute. Partial results merge by log-sum-exp in the stable form
    out = out - sigmoid(lse_blk - lse) * (out - out_blk),  lse = lse - logsigmoid(lse - lse_blk).
Backward runs the same ring again for K/V; the dK/dV of each block ride a second ring one step
behind, each rank adding its share in fp32, and arrive home after N steps.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import comm
from kernels.cp.attention_cost import AttentionLoad, attention_flops, hand_backward_only
from kernels.cp.layout import layout_of, local_positions
from kernels.layers import Ctx
from kernels.layers.attention import attention_block_backward, attention_block_forward

KV_TAG, DKV_TAG = 7100, 7101  # one tag per ring, so K/V and dK/dV messages never pair up


def block_plan(layout: str, rank: int, src: int, s_local: int):
    """Which query rows of `rank` meet which key rows of the block from `src`, and whether a
    causal mask is needed; None when every key lies in every query's future (skip the block).

    contiguous: src < rank is wholly past; src > rank wholly future.
    zigzag (chunks r, 2N-1-r): src < rank: all queries see src's first chunk, its second chunk
    is future; src > rank: only the second query chunk sees anything, and it sees all of it.
    """
    every = slice(0, s_local)
    if src == rank:
        return every, every, True
    if layout == "contiguous":
        return (every, every, False) if src < rank else None
    half = s_local // 2
    if src < rank:
        return every, slice(0, half), False
    return slice(half, s_local), every, False


def merge_block(out, lse, out_blk, lse_blk):
    """Fold one block's (out [B,H,S,hd], lse [B,H,S]) into the running pair, stably."""
    w = torch.sigmoid(lse_blk - lse).unsqueeze(-1)             # [B, H, S, 1]
    return out - w * (out - out_blk), lse - F.logsigmoid(lse - lse_blk)


def acc_dtype(dtype):
    """fp32 at least (float64 stays float64) for the merged output and the gradient rings."""
    return torch.promote_types(dtype, torch.float32)


class RingAttention:
    """Causal attention over the cp ring; `layout` is "ring" (contiguous blocks) or "zigzag"."""

    def __init__(self, group: comm.Group, seq: int, load: AttentionLoad, mode: str = "ring",
                 layer: int = 0):
        self.group, self.layer, self.mode, self.load = group, layer, mode, load
        self.layout = layout_of(mode)
        n = group.size
        self.positions = [local_positions(seq, self.layout, n, r) for r in range(n)]  # [S/N] each
        self.next = group.global_rank((group.rank + 1) % n)
        self.prev = group.global_rank((group.rank - 1) % n)

    def _pass_on(self, t: torch.Tensor, tag: int):
        """Send `t` to the next rank and receive its like from the previous one (both async)."""
        incoming = torch.empty_like(t)
        hs = comm.batch_isend_irecv([comm.P2P("send", t, self.next, tag, self.group),
                                     comm.P2P("recv", incoming, self.prev, tag, self.group)])
        self.load.transferred(hs)
        return hs, incoming

    def _mask_positions(self, r, src, qs, ks, masked, device):
        """Positions of the block's query and key rows when it needs the causal mask."""
        if not masked:
            return None, None
        return self.positions[r][qs].to(device), self.positions[src][ks].to(device)

    def _blocks(self):
        """(step, src, plan) for every step of the ring."""
        n, r = self.group.size, self.group.rank
        s_local = len(self.positions[r])
        for i in range(n):
            src = (r - i) % n
            yield i, src, block_plan(self.layout, r, src, s_local)

    def forward(self, q, k, v):                # q [B, H, S/N, hd]; k, v [B, KV, S/N, hd]
        hand_backward_only(q)
        n, r = self.group.size, self.group.rank
        b, h, _, d = q.shape
        kv = torch.stack([k, v]).contiguous()  # [2, B, KV, S/N, hd]: one message per step
        out = lse = None
        for i, src, plan in self._blocks():
            moving = self._pass_on(kv, KV_TAG) if i < n - 1 else None
            if plan is not None:
                qs, ks, masked = plan
                qp, kp = self._mask_positions(r, src, qs, ks, masked, q.device)
                flops = attention_flops(b, h, qs.stop - qs.start, ks.stop - ks.start, d, False)
                with self.load.block(f"{self.mode} block from cp{src}", flops, layer=self.layer,
                                     step=i):
                    o_blk, lse_blk, _ = attention_block_forward(
                        q[:, :, qs], kv[0][:, :, ks], kv[1][:, :, ks], qp, kp, keep_probs=False)
                    o_blk, lse_blk = o_blk.to(acc_dtype(q.dtype)), lse_blk.to(acc_dtype(q.dtype))
                    if out is None:            # step 0 is the local block: it covers every row
                        out, lse = o_blk, lse_blk
                    else:
                        out[:, :, qs], lse[:, :, qs] = merge_block(out[:, :, qs], lse[:, :, qs],
                                                                   o_blk, lse_blk)
            if moving is not None:
                comm.wait_all(moving[0])
                kv = moving[1]
        self.load.report(self.mode)
        return out.to(q.dtype), Ctx(q=q, k=k, v=v, o=out, lse=lse)

    def backward(self, ctx, do):               # do [B, H, S/N, hd]
        n, r = self.group.size, self.group.rank
        q, o, lse = ctx.q, ctx.o, ctx.lse
        b, h, _, d = q.shape
        acc = acc_dtype(q.dtype)
        kv = torch.stack([ctx.k, ctx.v]).contiguous()          # [2, B, KV, S/N, hd]
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)  # [B, H, S/N, hd]
        dkv_moving = None
        for i, src, plan in self._blocks():
            moving = self._pass_on(kv, KV_TAG) if i < n - 1 else None
            grads = None
            if plan is not None:
                qs, ks, masked = plan
                qp, kp = self._mask_positions(r, src, qs, ks, masked, q.device)
                flops = attention_flops(b, h, qs.stop - qs.start, ks.stop - ks.start, d, True,
                                        recompute=True)
                with self.load.block(f"{self.mode} backward block from cp{src}", flops,
                                     layer=self.layer, step=i):
                    # in the accumulation dtype: o and lse were merged there (bf16 q, k, v, do
                    # would meet fp32 probabilities), and each block's dq/dk/dv is summed there
                    dq_b, dk_b, dv_b = attention_block_backward(
                        q[:, :, qs].to(acc), kv[0][:, :, ks].to(acc), kv[1][:, :, ks].to(acc),
                        o[:, :, qs], lse[:, :, qs], do[:, :, qs].to(acc), qp, kp)
                    dq[:, :, qs] += dq_b
                    grads = (ks, dk_b, dv_b)
            # the dK/dV of block src: zeros at home (step 0), else what the previous rank sent
            if dkv_moving is None:
                dkv = torch.zeros_like(kv, dtype=acc)          # [2, B, KV, S/N, hd]
            else:
                comm.wait_all(dkv_moving[0])
                dkv = dkv_moving[1]
            if grads is not None:
                ks, dk_b, dv_b = grads
                dkv[0][:, :, ks] += dk_b
                dkv[1][:, :, ks] += dv_b
            dkv_moving = self._pass_on(dkv, DKV_TAG)           # after step N-1 it goes home
            if moving is not None:
                comm.wait_all(moving[0])
                kv = moving[1]
        comm.wait_all(dkv_moving[0])
        home = dkv_moving[1]                                   # own block's dK/dV, all ranks summed
        self.load.report(self.mode)
        ctx.q = ctx.k = ctx.v = ctx.o = None
        return dq.to(q.dtype), home[0].to(q.dtype), home[1].to(q.dtype)


class AllGatherAttention:
    """The baseline: every rank all-gathers K/V of the whole sequence and attends its own queries
    to it; backward reduce-scatters the full dK/dV so each rank gets its block's sum."""

    def __init__(self, group: comm.Group, seq: int, load: AttentionLoad, layer: int = 0):
        self.group, self.layer, self.load = group, layer, load
        n = group.size
        self.q_pos = local_positions(seq, "contiguous", n, group.rank)   # [S/N]
        self.k_pos = torch.arange(seq)                                    # [S]

    def forward(self, q, k, v):
        hand_backward_only(q)
        n = self.group.size
        b, h, s, d = q.shape
        kv = torch.stack([k, v]).contiguous()                  # [2, B, KV, S/N, hd]
        full = kv.new_empty((n * 2,) + kv.shape[1:])  # [N*2, B, KV, S/N, hd]
        gathering = comm.all_gather(full, kv, self.group, async_op=True)
        self.load.transferred([gathering])
        gathering.wait()
        full = full.reshape((n,) + kv.shape)                   # [N, 2, B, KV, S/N, hd]
        kv_heads = k.shape[1]
        kf, vf = full.permute(1, 2, 3, 0, 4, 5).reshape(2, b, kv_heads, n * s, d)  # [B, KV, S, hd]
        flops = attention_flops(b, h, s, n * s, d, backward=False)
        with self.load.block("allgather attention", flops, layer=self.layer):
            self.q_pos, self.k_pos = self.q_pos.to(q.device), self.k_pos.to(q.device)
            o, lse, p = attention_block_forward(q, kf, vf, self.q_pos, self.k_pos)
        self.load.report("allgather")
        return o, Ctx(q=q, k=kf, v=vf, o=o, lse=lse, p=p)

    def backward(self, ctx, do):
        n = self.group.size
        b, h, s, d = do.shape
        flops = attention_flops(b, h, s, n * s, d, backward=True)
        with self.load.block("allgather attention backward", flops, layer=self.layer):
            dq, dk, dv = attention_block_backward(ctx.q, ctx.k, ctx.v, ctx.o, ctx.lse, do,
                                                  self.q_pos, self.k_pos, probs=ctx.p)
        kv_heads = dk.shape[1]
        dkv = torch.stack([dk, dv]).reshape(2, b, kv_heads, n, s, d)  # [2, B, KV, N, S/N, hd]
        dkv = dkv.permute(3, 0, 1, 2, 4, 5).contiguous()       # [N, 2, B, KV, S/N, hd]
        mine = dkv.new_empty(dkv.shape[1:])     # [2, B, KV, S/N, hd]
        flat = dkv.reshape((n * 2,) + mine.shape[1:])          # [N*2, B, KV, S/N, hd]
        scattering = comm.reduce_scatter(mine, flat, self.group, async_op=True)
        self.load.transferred([scattering])
        scattering.wait()
        self.load.report("allgather")
        ctx.q = ctx.k = ctx.v = ctx.o = ctx.p = None
        return dq, mine[0], mine[1]
