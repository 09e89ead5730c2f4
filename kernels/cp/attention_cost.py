"""What every attention core shares: its per-step load (wall and CPU time of block compute, FLOPs,
the overlap of K/V transfers with that compute), the FLOP count of one block, and the refusal of
autograd (ring sends and all-to-alls are not autograd ops).

AttentionLoad is a collector of the rank's StepStats (kernels/stats.py): the engine drains its
attn_* figures into every step's result.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from kernels.comm import events
from planning.intervals import intersect, length, merge


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
        """The attn_* step figures, then start over."""
        computing = merge(self.compute)
        moving = merge([(rec.t_issue, rec.t_complete or rec.t_issue) for rec in self.transfers])
        moved = length(moving)
        out = {"attn_ms": self.wall_ns / 1e6, "attn_cpu_ms": self.cpu_ns / 1e6,
               "attn_flops": self.flops, "attn_comm_ms": moved / 1e6,
               "attn_overlap_pct": 100.0 * intersect(computing, moving) / moved if moved else 0.0}
        self.reset()
        return out


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
                         "backward=hand (the autograd oracle needs the whole sequence: cp=1)")
