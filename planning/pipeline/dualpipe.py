"""DualPipe and DualPipeV (DeepSeek-V3) as plain action lists, in DeepSeek's eight counted phases.

Layouts (see planning.pipeline.schedules for stages and chunks, planning.pipeline.actions for the data model):
  dualpipe   P ranks, P even, two directions of P stages each. chunk 0 = direction 0, stage_of(r, 0) = r;
             chunk 1 = direction 1, stage_of(r, 1) = P-1-r. Microbatches 0..M/2-1 travel direction 0 (rank 0
             feeds them, rank P-1 computes their loss), M/2..M-1 travel direction 1 (rank P-1 feeds them,
             rank 0 computes their loss).
  dualpipev  one V-shaped pipeline of 2P stages: stage_of(r, 0) = r, stage_of(r, 1) = 2P-1-r; every microbatch
             passes both chunks; rank P-1 hands chunk 0's output to chunk 1 locally; loss on rank 0.
             Any M >= 2P, odd included: DeepSeek's DualPipeV.step asserts only that (DualPipe.step
             also asks M even, each direction taking half); the rules are the records' in
             planning/pipeline/catalog.py.

A rank's program is written in *local phases*: phase 0 is the direction whose inputs arrive first. For dualpipe
the first half of the ranks have phase p = direction p, the second half are phase-flipped (phase p = direction
1-p); for dualpipev phase p = chunk p. Each phase keeps its own forward and backward microbatch counters, so
every chunk runs its microbatches in order. Backwards marked zero-bubble ("zb") run as "B" and queue their "W";
the others, and the backward half of every overlapped "FB" pair, are full backwards.
"""
from __future__ import annotations

from collections import deque

from planning.pipeline.actions import Action, Schedule, add_transfers


class _Program:
    """Accumulates one rank's compute actions from phase-level calls."""

    def __init__(self, chunk_of_phase, first_mb_of_chunk):
        self.chunk_of_phase = chunk_of_phase          # local phase -> chunk
        self.first_mb = first_mb_of_chunk             # chunk -> its first microbatch
        self.f_next = [0, 0]                          # per chunk: forwards done
        self.b_next = [0, 0]                          # per chunk: backwards done
        self.weights = deque()                        # deferred W's, FIFO as DeepSeek's WeightGradStore
        self.actions: list[Action] = []

    def _take(self, counter, phase) -> tuple[int, int]:
        chunk = self.chunk_of_phase[phase]
        mb = self.first_mb[chunk] + counter[chunk]
        counter[chunk] += 1
        return mb, chunk

    def F(self, phase):
        self.actions.append(Action("F", *self._take(self.f_next, phase)))

    def B(self, phase, zb=False):
        mb, chunk = self._take(self.b_next, phase)
        if zb:
            self.weights.append((mb, chunk))
        self.actions.append(Action("B" if zb else "BW", mb, chunk))

    def W(self):
        self.actions.append(Action("W", *self.weights.popleft()))

    def FB(self, phase_f, phase_b):
        mb, chunk = self._take(self.f_next, phase_f)
        mb2, chunk2 = self._take(self.b_next, phase_b)
        self.actions.append(Action("FB", mb, chunk, mb2=mb2, chunk2=chunk2))


def _eight_phases(prog: _Program, n: int, k: int, chunks: int, plain_first_pair: bool) -> list[Action]:
    """DeepSeek's phases for one rank. n = ranks on one arm of the pipeline (P/2 for dualpipe, P for dualpipev),
    k = this rank's distance from the outer end (half_rank resp. rank), chunks = microbatches per phase."""
    p = prog
    for _ in range((n - k - 1) * 2):        # 1. nF0: fill the phase-0 pipeline up to this rank
        p.F(0)
    for _ in range(k + 1):                  # 2. nF0F1: a forward of each phase, alternating
        p.F(0)
        p.F(1)
    for _ in range(n - k - 1):              # 3. nB1W1F1: phase-1 backward with its W at once (zero bubble)
        p.B(1, zb=True)
        p.W()
        p.F(1)
    for i in range(chunks - 2 * n + k + 1):  # 4. main loop nF0B1F1B0: two overlapped forward-backward pairs
        if i == 0 and plain_first_pair:     # the innermost ranks do not overlap their first pair (less bubble)
            p.F(0)
            p.B(1)
        else:
            p.FB(0, 1)
        p.FB(1, 0)
    for _ in range(n - k - 1):              # 5. nB1F1B0: phase-0 forwards are done; drain phase 1
        p.B(1)
        p.FB(1, 0)
    zb = False
    for i in range(k + 1):                  # 6. nB1B0: backwards of both phases, zero bubble from halfway on
        if i == (k + 1) // 2 and k % 2 == 1:
            zb = True
        p.B(1, zb=zb)
        if i == (k + 1) // 2 and k % 2 == 0:
            zb = True
        p.B(0, zb=zb)
    for _ in range(n - k - 1):              # 7. nWB0: a deferred W, then a zero-bubble phase-0 backward
        p.W()
        p.B(0, zb=True)
    for _ in range(k + 1):                  # 8. nW: the remaining deferred W's
        p.W()
    assert not p.weights, "weight-grad queue must be empty at the end of the step"
    return p.actions


def dualpipe(pp: int, microbatches: int) -> Schedule:
    """DualPipe: bidirectional; rank r holds stage r of direction 0 and stage P-1-r of direction 1."""
    if not isinstance(pp, int) or pp < 2 or pp % 2:
        raise ValueError(f"dualpipe needs an even pp >= 2, got pp {pp}: use pp={max(2, pp + pp % 2)} "
                         f"or schedule=dualpipev (any pp)")
    if not isinstance(microbatches, int) or microbatches < 2 * pp or microbatches % 2:
        good = max(2 * pp, microbatches + microbatches % 2) if isinstance(microbatches, int) else 2 * pp
        raise ValueError(f"dualpipe needs even microbatches >= 2*pp = {2 * pp}, got microbatches "
                         f"{microbatches}: use microbatches={good}")
    half = pp // 2
    per_direction = microbatches // 2
    compute = []
    for rank in range(pp):
        flipped = rank >= half                      # second half of the ranks: phases swap directions
        prog = _Program(chunk_of_phase=(1, 0) if flipped else (0, 1), first_mb_of_chunk=(0, per_direction))
        half_rank = min(rank, pp - 1 - rank)
        compute.append(_eight_phases(prog, half, half_rank, per_direction, plain_first_pair=half_rank == half - 1))
    table = tuple((r, pp - 1 - r) for r in range(pp))
    s = Schedule("dualpipe", pp, microbatches, pp, 2, table, compute, split_w=True, directions=2)
    return add_transfers(s)


def dualpipev(pp: int, microbatches: int) -> Schedule:
    """DualPipeV: V-shaped; rank r holds stages r and 2P-1-r of one 2P-stage pipeline."""
    if not isinstance(pp, int) or pp < 1:
        raise ValueError(f"dualpipev: pp must be an integer >= 1, got {pp!r}")
    if not isinstance(microbatches, int) or microbatches < 2 * pp:
        raise ValueError(f"dualpipev needs microbatches >= 2*pp = {2 * pp}, got microbatches {microbatches}: "
                         f"use microbatches={2 * pp}")
    compute = []
    for rank in range(pp):
        prog = _Program(chunk_of_phase=(0, 1), first_mb_of_chunk=(0, 0))
        compute.append(_eight_phases(prog, pp, rank, microbatches, plain_first_pair=rank == pp - 1))
    table = tuple((r, 2 * pp - 1 - r) for r in range(pp))
    s = Schedule("dualpipev", pp, microbatches, 2 * pp, 2, table, compute, split_w=True)
    return add_transfers(s)
