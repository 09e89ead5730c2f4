"""Context parallelism: the sequence split over the cp ranks, and the attention cores that see it.

    layout    which tokens a rank holds: a contiguous block (ring, ulysses, allgather) or the
              zigzag pair of chunks r and 2N-1-r (cut into 2N chunks, so causal work balances)
    cores     ring / zigzag (kernels/cp_ring.py): K/V blocks travel the ring, partial results
              merged by log-sum-exp; ulysses (here): all-to-all from sequence shards to head
              shards, full-sequence attention on the local heads, and back; allgather
              (kernels/cp_ring.py): every rank gathers all K/V, the baseline of `partui bench cp`
    load      attention time, FLOPs and the K/V rotation's overlap with block compute per step,
              in the trace (span cat "attention", counter "attention load") and in `cp_stats()`

Dense parameters stay replicated over cp; their grads are summed over "cp_dp" by kernels/dp.py.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from kernels import comm

from kernels.comm import events
from kernels.layers import Ctx, rope_tables
from kernels.layers.attention import attention_block_backward, attention_block_forward

CORE_MODES = ("ring", "zigzag", "ulysses", "allgather")


# ---------------------------------------------------------------- layout

def chunks_of(mode: str, n: int, rank: int) -> tuple[int, list[int]]:
    """(number of equal chunks the sequence is cut into, the chunks `rank` holds in order)."""
    if mode == "zigzag":
        return 2 * n, [rank, 2 * n - 1 - rank]
    return n, [rank]


def local_positions(seq: int, mode: str, n: int, rank: int) -> torch.Tensor:
    """True positions of the tokens `rank` holds, in the order it holds them: [seq / n]."""
    pieces, mine = chunks_of(mode, n, rank)
    if seq % pieces:
        raise ValueError(f"seq {seq} is not divisible by {pieces} chunks for cp {n} {mode}: pick "
                         f"seq a multiple of {pieces}")
    c = seq // pieces
    return torch.cat([torch.arange(i * c, (i + 1) * c) for i in mine])


def _layout_mode(ctx) -> str:
    return "zigzag" if ctx.plan.cp_mode == "zigzag" else "contiguous"


def sequence_shard(t: torch.Tensor, ctx) -> torch.Tensor:
    """This cp rank's tokens of a [batch, seq] tensor (ids or targets)."""
    g = ctx.group("cp")
    pos = local_positions(t.shape[1], _layout_mode(ctx), g.size, g.rank)
    return t[:, pos].contiguous()                                    # [batch, seq / cp]


# ---------------------------------------------------------------- load figures

class AttentionLoad:
    """Attention work of this rank since the last `take()`: wall and CPU time of block compute,
    FLOPs, and the intervals of compute and of K/V (and dK/dV) transfers, for their overlap."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.wall_ns = self.cpu_ns = self.flops = 0
        self.compute: list[tuple[int, int]] = []
        self.transfers: list = []                  # comm.OpRecord of every K/V (dK/dV) transfer

    @contextmanager
    def block(self, name: str, flops: int, **args):
        t0, c0 = events.now_ns(), time.thread_time_ns()
        with events.span(name, "attention", flops=flops, **args):
            yield
        t1 = events.now_ns()
        # CPU time of this thread: the work itself, not the time another rank's process had the core
        self.cpu_ns += time.thread_time_ns() - c0
        self.wall_ns += t1 - t0
        self.flops += flops
        self.compute.append((t0, t1))

    def transferred(self, handles) -> None:
        self.transfers.extend(h.rec for h in handles)  # records only: the buffers may go

    def report(self, core: str) -> None:
        """Running totals of this step, as a trace counter (numbers only: Perfetto plots them)."""
        events.counter(f"attention load ({core})", ms=self.wall_ns / 1e6, flops=self.flops)

    def take(self) -> dict:
        from kernels.engine import _intersect, _length, _merge  # the engine's interval helpers
        comp = _merge(self.compute)
        moving = _merge([(rec.t_issue, rec.t_complete or rec.t_issue) for rec in self.transfers])
        moved = _length(moving)
        out = {"attn_ms": self.wall_ns / 1e6, "attn_cpu_ms": self.cpu_ns / 1e6,
               "attn_flops": self.flops, "attn_comm_ms": moved / 1e6,
               "attn_overlap_pct": 100.0 * _intersect(comp, moving) / moved if moved else 0.0}
        self.reset()
        return out


LOAD = AttentionLoad()


def cp_stats() -> dict:
    """This rank's attention figures since the last call (the engine merges them per step)."""
    return LOAD.take()


def attention_flops(b: int, h: int, sq: int, sk: int, hd: int, backward: bool,
                    recompute: bool = False) -> int:
    """Matmul FLOPs of one block: forward QK^T and PV; backward dV, dP, dQ, dK (+ QK^T again
    when the probabilities are recomputed rather than kept)."""
    matmuls = (4 + (1 if recompute else 0)) if backward else 2
    return 2 * matmuls * b * h * sq * sk * hd


def hand_backward_only(q: torch.Tensor) -> None:
    """Ring sends and all-to-alls are not autograd ops: gradients would stop at the rank."""
    if q.requires_grad and torch.is_grad_enabled():
        raise ValueError("context-parallel attention has a hand-written backward only: run with "
                         "--backward hand (the autograd oracle needs the whole sequence: --cp 1)")


# ---------------------------------------------------------------- Ulysses

class UlyssesAttention:
    """All-to-all from sequence shards [B, H, S/N, hd] to head shards [B, H/N, S, hd], causal
    attention over the whole sequence on the local heads, and the reverse all-to-all.
    Contiguous heads per rank keep grouped-query pairs together (H/N = G x KV/N)."""

    def __init__(self, group: comm.Group, seq: int, layer: int = 0):
        self.group, self.layer = group, layer
        self.positions = torch.arange(seq)

    def _check(self, h: int, kv: int) -> None:
        n = self.group.size
        if h % n or kv % n:
            raise ValueError(f"Ulysses splits heads over cp {n}: this rank has {h} heads and {kv} "
                             f"kv heads, which must be divisible by {n}; pick cp dividing both "
                             f"(with tp, per tp rank) or use --cp-mode ring")

    def _seq_to_heads(self, t):                  # [B, X, S/N, hd] -> [B, X/N, S, hd]
        n = self.group.size
        b, x, s, d = t.shape
        send = t.reshape(b, n, x // n, s, d).transpose(0, 1).contiguous()  # [N, B, X/N, S/N, hd]
        recv = torch.empty_like(send)                                       # [N(src), ...]
        h = comm.all_to_all_single(recv, send, self.group, async_op=True)
        return h, lambda: recv.permute(1, 2, 0, 3, 4).reshape(b, x // n, n * s, d)

    def _heads_to_seq(self, t):                  # [B, X/N, S, hd] -> [B, X, S/N, hd]
        n = self.group.size
        b, x, s, d = t.shape
        send = t.reshape(b, x, n, s // n, d).permute(2, 0, 1, 3, 4).contiguous()
        recv = torch.empty_like(send)                                       # [N(head group), ...]
        h = comm.all_to_all_single(recv, send, self.group, async_op=True)
        return h, lambda: recv.transpose(0, 1).reshape(b, n * x, s // n, d)

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
        with LOAD.block("ulysses attention", flops, layer=self.layer):
            self.positions = self.positions.to(q.device)
            o, lse, p = attention_block_forward(qh, kh, vh, self.positions, self.positions)
        LOAD.report("ulysses")
        (out,) = self._all((o,), self._heads_to_seq)                   # [B, H, S/N, hd]
        return out, Ctx(q=qh, k=kh, v=vh, o=o, lse=lse, p=p)

    def backward(self, ctx, do):
        (doh,) = self._all((do,), self._seq_to_heads)                  # [B, H/N, S, hd]
        b, h, s, d = doh.shape
        with LOAD.block("ulysses attention backward", attention_flops(b, h, s, s, d, True),
                        layer=self.layer):
            dq, dk, dv = attention_block_backward(ctx.q, ctx.k, ctx.v, ctx.o, ctx.lse, doh,
                                                  self.positions, self.positions, probs=ctx.p)
        LOAD.report("ulysses")
        ctx.q = ctx.k = ctx.v = ctx.o = ctx.p = None
        return tuple(self._all((dq, dk, dv), self._heads_to_seq))     # [B, H|KV, S/N, hd]


# ---------------------------------------------------------------- entry points

def make_core(mode: str, group: comm.Group, seq: int, layer: int = 0):
    """The attention core of `mode` for this rank of the cp `group`."""
    if mode not in CORE_MODES:
        raise ValueError(f"unknown cp core {mode!r}: pick one of {', '.join(CORE_MODES)}")
    if mode == "ulysses":
        return UlyssesAttention(group, seq, layer)
    from kernels.cp.ring import AllGatherAttention, RingAttention
    if mode == "allgather":
        return AllGatherAttention(group, seq, layer)
    return RingAttention(group, seq, mode, layer)


def apply_context_parallel(layers: list, ctx, mode: str | None = None) -> None:
    """Give every Block's attention the cp core and RoPE tables at this rank's true positions.
    `mode` overrides the plan's cp mode (the benchmark swaps in the all-gather baseline; it
    keeps the contiguous layout, so only ring-layout plans may switch to it)."""
    from kernels.model import Block
    mode = mode or ctx.plan.cp_mode
    if mode == "allgather" and ctx.plan.cp_mode == "zigzag":
        raise ValueError("the all-gather core expects the contiguous layout: build the plan with "
                         "--cp-mode ring, then switch to allgather")
    g, cfg = ctx.group("cp"), ctx.cfg
    pos = local_positions(cfg.seq, "zigzag" if mode == "zigzag" else "contiguous", g.size, g.rank)
    for layer in layers:
        if not isinstance(layer, Block):
            continue
        attn = layer.attn
        like = attn.cos                        # keep the tables' dtype and device
        cos, sin = rope_tables(pos, cfg.head_dim, cfg.rope_theta, like.dtype)  # [S/N, hd]
        attn.cos, attn.sin = cos.to(like.device), sin.to(like.device)
        attn.core = make_core(mode, g, cfg.seq, layer.index)
