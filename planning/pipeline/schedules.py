"""Pipeline-parallel schedules as plain data: one list of actions per pp rank, testable without processes.

Stages and chunks. A rank holds `chunks_per_rank` (v) model chunks; `stage_of(rank, chunk)` is the global
stage index. Stage s feeds stage s+1 with activations, gradients go back s+1 -> s; stage 0 consumes the
input tokens, stage `stages-1` computes the loss.
    gpipe, 1f1b, zb1p   v=1, stage_of(r, 0) = r.
    interleaved         v chunks, stage_of(r, c) = c*P + r (Megatron's virtual pipeline).
    dualpipe            two directions (two model copies), each P stages; `stages` = P counts one direction.
                        chunk 0 = direction 0: stage_of(r, 0) = r        (rank 0 feeds its inputs).
                        chunk 1 = direction 1: stage_of(r, 1) = P-1-r    (rank P-1 feeds its inputs).
                        Microbatches 0..M/2-1 go through direction 0 only, M/2..M-1 through direction 1 only.
    dualpipev           one V-shaped pipeline of 2P stages: stage_of(r, 0) = r, stage_of(r, 1) = 2P-1-r.
                        On rank P-1 stage P-1 feeds stage P locally (no SEND/RECV; the executor treats
                        stage_of(rank,0)+1 == stage_of(rank,1) as a local hand-off). Loss on rank 0.
Any hand-off between two chunks of one rank is local and has no SEND/RECV action.

The data model (Action kinds, Schedule, where SEND / RECV go) is planning/pipeline/actions.py; this module holds the
generators of gpipe, 1f1b, zb1p and interleaved (dualpipe and dualpipev: planning/pipeline/dualpipe.py); each
schedule's record, and build_schedule / plan_schedule, are planning/pipeline/catalog.py.

Execution semantics `validate` checks (planning.pipeline.simulate runs them as a dataflow):
  1. A rank walks its list in order. SEND_*/RECV_* post an async p2p op and never block when posted.
  2. A compute action blocks until the RECVs it consumes are complete; a RECV completes once the matching SEND is
     posted. Sends are waited only at the end of the step (or when their buffer is reused). An executor must
     NOT wait on its sends before its next compute (DeepSeek's commit-and-wait of every posted op): with each
     RECV placed right before its consumer, that stricter rule deadlocks interleaved, dualpipe and dualpipev
     (planning.pipeline.simulate.run_dataflow(strict=True) shows where).
  3. Matching: on each channel (src, dst, activation|gradient) the k-th SEND pairs with the k-th RECV (FIFO);
     validate checks both sides list the same (mb, stage) sequence, so one p2p tag per channel suffices. Across
     the two kinds on one rank pair the order may differ (dualpipe, dualpipev): use distinct tags for
     activations and gradients (or a backend that matches per tag), not one FIFO per rank pair.
"""
from __future__ import annotations

from planning.pipeline.actions import Action, Schedule, add_transfers
from planning.pipeline.simulate import Cost, check_structure, run_dataflow


def _plain(name: str, pp: int, microbatches: int, compute: list[list[Action]], split_w: bool) -> Schedule:
    table = tuple((r,) for r in range(pp))
    return add_transfers(Schedule(name, pp, microbatches, pp, 1, table, compute, split_w))


# ---------------------------------------------------------------- input checks

def _check_counts(name: str, pp: int, microbatches: int) -> None:
    if not isinstance(pp, int) or pp < 1:
        raise ValueError(f"{name}: pp must be an integer >= 1, got {pp!r}")
    if not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"{name}: microbatches must be an integer >= 1, got {microbatches!r}")


def _need_at_least_pp(name: str, pp: int, microbatches: int) -> None:
    if microbatches < pp:
        raise ValueError(f"{name} needs microbatches >= pp, got microbatches {microbatches} < pp {pp}: "
                         f"use microbatches={pp} or more")


# ---------------------------------------------------------------- one-chunk schedules

def gpipe(pp: int, microbatches: int) -> Schedule:
    """All forwards, then all full backwards (in microbatch order)."""
    _check_counts("gpipe", pp, microbatches)
    compute = [[Action("F", m) for m in range(microbatches)] + [Action("BW", m) for m in range(microbatches)]
               for _ in range(pp)]
    return _plain("gpipe", pp, microbatches, compute, split_w=False)


def one_f_one_b(pp: int, microbatches: int, fb_overlap: bool = False) -> Schedule:
    """PipeDream-flush 1F1B: P-1-rank warmup forwards, then one forward one full backward, then cooldown.
    fb_overlap: each steady-state forward and backward run as one overlapped pair (an FB action, Megatron-Core's
    combined 1F1B). A pair waits for its backward's gradient before it starts, so rank r's pair i must not feed
    the pair of rank r+1 it waits for: rank r runs 2(P-1-r)+1 warmup forwards (not P-1-r), so rank r+1's pair i
    takes a forward rank r made two pairs earlier. The bubble stays 1F1B's (P-1)(F+B) with pairs costing F+B;
    activations held grow from P to 2P-1 on rank 0."""
    _check_counts("1f1b", pp, microbatches)
    _need_at_least_pp("1f1b", pp, microbatches)
    compute = []
    for rank in range(pp):
        warmup = min(microbatches, 2 * (pp - 1 - rank) + 1) if fb_overlap else pp - 1 - rank
        seq = [Action("F", m) for m in range(warmup)]
        for i in range(microbatches - warmup):    # steady: the forward of mb warmup+i, the backward of mb i
            seq += ([Action("FB", warmup + i, mb2=i, chunk2=0)] if fb_overlap
                    else [Action("F", warmup + i), Action("BW", i)])
        seq += [Action("BW", m) for m in range(microbatches - warmup, microbatches)]
        compute.append(seq)
    return _plain("1f1b", pp, microbatches, compute, split_w=False)


def zb1p(pp: int, microbatches: int) -> Schedule:
    """Zero-bubble ZB-H1: 1F1B order of F and B (input grad only), each W deferred so that rank r keeps r of
    them pending: the gradient chain to rank 0 then runs at B-W per hop and the deferred W's fill the tail,
    with 1F1B's activation memory. Bubble (P-1)(F+B-2W)."""
    _check_counts("zb1p", pp, microbatches)
    _need_at_least_pp("zb1p", pp, microbatches)
    compute = []
    for rank in range(pp):
        warmup = pp - 1 - rank
        pending = []                                # W's not yet run, oldest first
        seq = [Action("F", m) for m in range(warmup)]
        for i in range(microbatches):
            if warmup + i < microbatches:           # steady phase: one forward before each backward
                seq.append(Action("F", warmup + i))
            seq.append(Action("B", i))
            pending.append(i)
            if len(pending) > rank:                 # later ranks finish their B's earlier, so they defer more W
                seq.append(Action("W", pending.pop(0)))
        seq += [Action("W", m) for m in pending]
        compute.append(seq)
    return _plain("zb1p", pp, microbatches, compute, split_w=True)


def interleaved(pp: int, microbatches: int, virtual: int = 2) -> Schedule:
    """Megatron's interleaved 1F1B: v chunks per rank, microbatches in groups of pp per chunk."""
    _check_counts("interleaved", pp, microbatches)
    if not isinstance(virtual, int) or virtual < 1:
        raise ValueError(f"interleaved: virtual_stages must be an integer >= 1, got {virtual!r}: use "
                         f"virtual_stages=2")
    if microbatches < pp or microbatches % pp != 0:
        raise ValueError(f"interleaved needs microbatches a multiple of pp and >= pp, got microbatches "
                         f"{microbatches} with pp {pp}: use microbatches={max(pp, -(-microbatches // pp) * pp)}")
    total = microbatches * virtual

    def place(k: int, backward: bool) -> tuple[int, int]:
        group = k // (pp * virtual)              # which block of pp microbatches
        chunk = (k // pp) % virtual
        return group * pp + k % pp, (virtual - 1 - chunk) if backward else chunk

    compute = []
    for rank in range(pp):
        # Megatron runs all forwards first when microbatches == pp
        warmup = total if microbatches == pp else min(total, (pp - rank - 1) * 2 + (virtual - 1) * pp)
        seq = [Action("F", *place(k, False)) for k in range(warmup)]
        for i in range(total - warmup):
            seq += [Action("F", *place(warmup + i, False)), Action("BW", *place(i, True))]
        seq += [Action("BW", *place(k, True)) for k in range(total - warmup, total)]
        compute.append(seq)
    table = tuple(tuple(c * pp + r for c in range(virtual)) for r in range(pp))
    s = Schedule("interleaved", pp, microbatches, pp * virtual, virtual, table, compute, split_w=False,
                 cost_scale=1 / virtual)
    return add_transfers(s)


def check_schedule(schedule: Schedule) -> None:
    """Raise ValueError unless the schedule is complete, ordered, matched and deadlock-free (see module doc)."""
    check_structure(schedule)
    run_dataflow(schedule, Cost(), strict=False)   # raises on a deadlock or a missing / misplaced transfer

