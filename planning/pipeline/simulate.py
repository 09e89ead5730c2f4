"""Replay a schedule's action lists as a dataflow under a cost model: timeline, bubble, activations held.

Semantics (the ones planning.pipeline.schedules documents; data model: planning.pipeline.actions): ranks walk their lists
in order; SEND/RECV post async ops and never block when posted; a compute starts when its rank is free and
the data it consumes has arrived (a SEND's data arrives `p2p` after it was posted, and it is posted right
after its producer finished). With strict=True a compute also waits for *every* op its rank posted so far,
a SEND being complete once the peer posted the matching RECV (DeepSeek's commit-and-wait): the schedules
here are not built for that rule and several deadlock under it. Comm actions take no rank time.

Costs (DeepSeek's convention, so its formulas read directly): F a forward chunk, B a *full* backward chunk,
W its weight-grad part, FB an overlapped forward + full backward pair (default F+B). A split "B" action
(backward-input only) costs B-W, "W" costs W, "BW" costs B. Costs are for one chunk of dualpipe/dualpipev
(DeepSeek's unit) and for a rank's whole share of layers otherwise: an interleaved chunk (1/v of it) costs 1/v.
Bubble of a rank = makespan - its busy time (idle between the step's start 0 and the step's end).
Timing (optional) replays a recorded run honestly: each rank's own compute per action (or per kind and chunk), rank time
spent posting each p2p op and dispatching each compute (not compute: it enters the bubble), and a transfer time
per edge (src, dst) from a SEND's post to its data being usable at dst, in place of the uniform p2p.
Activations held = forwards whose backward-input has not run yet (an FB pair counts its forward first).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from planning.pipeline.actions import COMM_KINDS, COMPUTE_KINDS, Action, Schedule
from planning.replay import Dep, Op, Stuck, gc_paused, run


@dataclass(frozen=True)
class Cost:
    F: float = 1.0
    B: float = 2.0          # full backward (input grad + weight grad)
    W: float = 1.0          # weight-grad part of B
    FB: float | None = None  # overlapped F&B pair; None -> F + B
    p2p: float = 0.0        # latency of one transfer

    def __post_init__(self):
        for k in ("F", "B", "W", "p2p"):
            if getattr(self, k) < 0:
                raise ValueError(f"cost {k} must be >= 0, got {getattr(self, k)}")
        if self.W >= self.B and self.B > 0:
            raise ValueError(f"cost W {self.W} must be < B {self.B} (B is the full backward, W its weight-grad "
                             f"part): e.g. B=2,W=1")
        if self.FB is not None and self.FB < 0:
            raise ValueError(f"cost FB must be >= 0, got {self.FB}")

    @property
    def fb(self) -> float:
        return self.F + self.B if self.FB is None else self.FB


@dataclass(frozen=True)
class Timing:
    """Measured times beyond Cost's uniform ones, in Cost's unit (each optional; missing keys fall back to Cost).
    A compute action occupies its rank for dispatch + compute, but only compute counts as busy; a SEND / RECV
    occupies its rank for its post time (never busy); a SEND's data is usable at dst latency[(src, dst)] after
    its post began."""
    compute: dict = field(default_factory=dict)    # (rank, kind, chunk[, mb]) -> compute of that action (F/B/W/BW/FB)
    dispatch: dict = field(default_factory=dict)   # rank -> rank time before each compute that is not compute
    post: dict = field(default_factory=dict)       # (rank, "SEND" | "RECV"[, n]) -> rank time to post one (its n-th)
    latency: dict = field(default_factory=dict)    # (src, dst[, n]) -> SEND's post to data usable at dst (n-th RECV)

    def __post_init__(self):
        for name in ("compute", "dispatch", "post", "latency"):
            bad = {k: v for k, v in getattr(self, name).items() if not v >= 0}
            if bad:
                raise ValueError(f"timing {name} must be >= 0, got {bad}")


@dataclass
class SimResult:
    schedule: Schedule
    cost: Cost
    spans: list[list[tuple[float, float, Action]]]  # per rank: (start, end, compute action)
    makespan: float
    busy: list[float]
    bubble_per_rank: list[float]
    peak_activations: list[int]
    posts: list[list[tuple[float, float, Action]]] = field(default_factory=list)  # per rank: SEND / RECV posts
    reached: list[list[float]] = field(default_factory=list)  # per rank, per span: when the rank got to it

    @property
    def bubble(self) -> float:
        return max(self.bubble_per_rank)

    @property
    def bubble_rank(self) -> int:
        return self.bubble_per_rank.index(self.bubble)


def _parts(a: Action):
    """(part, mb, chunk) computed by an action: part "F" forward, "B" backward-input, "W" weight grad."""
    if a.kind == "F":
        return [("F", a.mb, a.chunk)]
    if a.kind == "W":
        return [("W", a.mb, a.chunk)]
    if a.kind in ("B", "BW"):
        return [("B", a.mb, a.chunk)] + ([("W", a.mb, a.chunk)] if a.kind == "BW" else [])
    return [("F", a.mb, a.chunk), ("B", a.mb2, a.chunk2), ("W", a.mb2, a.chunk2)]  # FB


def check_structure(s: Schedule) -> None:
    """Every (stage, mb) has F, B and W exactly once, in that order on its rank; peers and FIFO channels match."""
    if len(s.actions) != s.pp:
        raise ValueError(f"{s.name}: {len(s.actions)} action lists for pp {s.pp}")
    seen = {}                                   # (part, stage, mb) -> (rank, position)
    channels = {}                               # (src, dst, F|B, side) -> [(mb, producer stage)]
    for rank, seq in enumerate(s.actions):
        for pos, a in enumerate(seq):
            where = f"{s.name} rank {rank} action {pos} {a}"
            if a.kind not in COMPUTE_KINDS + COMM_KINDS:
                raise ValueError(f"{where}: unknown kind {a.kind!r}")
            pairs = [(a.mb, a.chunk)] + ([(a.mb2, a.chunk2)] if a.kind == "FB" else [])
            for mb, chunk in pairs:
                if mb is None or not 0 <= mb < s.microbatches or chunk is None or not 0 <= chunk < s.chunks_per_rank:
                    raise ValueError(f"{where}: microbatch or chunk out of range")
                if s.direction_of(mb) != s.chunk_direction(chunk):
                    raise ValueError(f"{where}: microbatch {mb} does not travel chunk {chunk}'s direction")
            if a.kind in COMM_KINDS:
                stage = s.stage_of(rank, a.chunk)
                step = 1 if a.kind in ("SEND_F", "RECV_B") else -1
                if not 0 <= stage + step < s.stages or s.holder(stage + step, a.mb)[0] != a.peer or a.peer == rank:
                    raise ValueError(f"{where}: peer should be the holder of the neighbouring stage {stage + step}")
                send = a.kind.startswith("SEND")
                src, dst = (rank, a.peer) if send else (a.peer, rank)
                producer = stage if send else stage + step
                channels.setdefault((src, dst, a.kind[-1], send), []).append((a.mb, producer))
                continue
            if a.kind == "W" and not s.split_w:
                raise ValueError(f"{where}: W in a schedule without split weight grads")
            for part, mb, chunk in _parts(a):
                key = (part, s.stage_of(rank, chunk), mb)
                if key in seen:
                    raise ValueError(f"{where}: {part} of stage {key[1]} microbatch {mb} runs twice")
                seen[key] = (rank, pos)
    for stage in range(s.stages):
        for mb in range(s.microbatches):
            rank, chunk = s.holder(stage, mb)
            at = [seen.get((part, stage, mb)) for part in "FBW"]
            if None in at:
                missing = "FBW"[at.index(None)]
                raise ValueError(f"{s.name}: {missing} of stage {stage} microbatch {mb} is missing")
            if any(r != rank for r, _ in at):
                raise ValueError(f"{s.name}: stage {stage} microbatch {mb} runs on the wrong rank")
            if not at[0][1] < at[1][1] <= at[2][1]:
                raise ValueError(f"{s.name}: rank {rank} stage {stage} microbatch {mb}: F, B, W out of order")
    for (src, dst, kind, send), seq in channels.items():
        other = channels.get((src, dst, kind, not send), [])
        if seq != other:
            raise ValueError(f"{s.name}: {kind} transfers {src}->{dst}: sends {channels.get((src, dst, kind, True), [])}"
                             f" and recvs {channels.get((src, dst, kind, False), [])} (mb, producer stage) do not pair in order")


def run_dataflow(s: Schedule, cost: Cost, strict: bool = False, timing: Timing | None = None) -> SimResult:
    """Execute all ranks' lists as a dataflow; raise ValueError on a deadlock or a missing/misplaced transfer."""
    with gc_paused():
        return _dataflow(s, cost, strict, timing)


def _dataflow(s: Schedule, cost: Cost, strict: bool, timing: Timing | None) -> SimResult:
    P = s.pp
    timing = timing or Timing()
    dur = {"F": cost.F, "B": cost.B - cost.W if s.split_w else cost.B, "W": cost.W, "BW": cost.B, "FB": cost.fb}
    dur = {k: v * s.cost_scale for k, v in dur.items()}
    ops, computes, posts = [], [[] for _ in range(P)], [[] for _ in range(P)]
    held, peak = [0] * P, [0] * P
    sent, posted = set(), set()                  # transfer keys whose SEND / RECV is in a list

    def key_of(rank, a, part, send):
        stage = s.stage_of(rank, a.chunk)
        step = 1 if part == "F" else -1              # direction data flows in
        peer = s.holder(stage + step if send else stage - step, a.mb)[0]
        producer = stage if send else stage - step
        return (part, a.mb, producer, rank, peer) if send else (part, a.mb, producer, peer, rank)

    for r, seq in enumerate(s.actions):          # each rank's program: its rules hold in list order
        done, nth, from_peer, recv_n = set(), {}, {}, {}     # parts run; posts per side; RECV -> n
        open_recvs, open_sends = {}, []          # posted, not yet waited (a dict: ordered, O(1) pop)
        for i, a in enumerate(seq):
            if a.kind in COMM_KINDS:
                part, send = a.kind[-1], a.kind.startswith("SEND")
                k = key_of(r, a, part, send)
                book = sent if send else posted
                if k in book:
                    raise ValueError(f"{s.name} rank {r}: {a} posted twice")
                if send and (part, s.stage_of(r, a.chunk), a.mb) not in done:
                    raise ValueError(f"{s.name} rank {r}: {a} comes before the compute that produces its data")
                book.add(k)
                side = "SEND" if send else "RECV"
                nth[(r, side)] = n = nth.get((r, side), -1) + 1
                if not send:                     # the n-th RECV from this peer, for its own transfer time
                    from_peer[k[3:]] = recv_n[k] = from_peer.get(k[3:], -1) + 1
                ops.append(Op((side, k), r, timing.post.get((r, side, n), timing.post.get((r, side), 0.0))))
                posts[r].append(((side, k), a))
                if send:
                    open_sends.append(k)
                else:
                    open_recvs[k] = None
                continue
            inputs = []
            for part, mb, chunk in _parts(a):    # the remote transfers it consumes; local ones ran
                stage = s.stage_of(r, chunk)
                src_stage = stage - 1 if part == "F" else stage + 1
                if part == "W" or not 0 <= src_stage < s.stages:
                    continue
                src, _ = s.holder(src_stage, mb)
                if src == r:
                    if (part, src_stage, mb) not in done:
                        raise ValueError(f"{s.name} rank {r}: {a} needs stage {src_stage}'s {part} of microbatch "
                                         f"{mb}, which this rank runs later in its list")
                    continue
                k = (part, mb, src_stage, src, r)
                if k not in recv_n:
                    raise ValueError(f"{s.name} rank {r}: {a} needs data from rank {src} but no RECV_{part} "
                                     f"was posted before it")
                inputs.append(k)
            wait_recv = list(open_recvs) if strict else inputs
            wait_send = list(open_sends) if strict else []
            if timing.dispatch.get(r, 0.0):      # rank time before the compute, not compute
                ops.append(Op(("dispatch", r, i), r, timing.dispatch[r]))
            own = timing.compute.get((r, a.kind, a.chunk, a.mb), timing.compute.get((r, a.kind, a.chunk)))
            after = [Dep(("SEND", k), timing.latency.get(k[3:] + (recv_n[k],), timing.latency.get(
                         k[3:], cost.p2p)), at="start") for k in wait_recv]
            ops.append(Op(("compute", r, i), r, dur[a.kind] if own is None else own,
                          tuple(after + [Dep(("RECV", k), at="start") for k in wait_send])))
            computes[r].append((("compute", r, i), a))
            for k in wait_recv:
                open_recvs.pop(k, None)
            if strict:
                open_sends = []
            for part, mb, chunk in _parts(a):
                done.add((part, s.stage_of(r, chunk), mb))
                if part == "F":
                    held[r] += 1
                    peak[r] = max(peak[r], held[r])
                elif part == "B":
                    held[r] -= 1
    try:
        got = run(ops, {r: 0.0 for r in range(P)})
    except Stuck as e:
        detail = "; ".join(f"rank {r} at {s.actions[r][op[2]]} waits for {miss[1][0]} of {miss[1][1][0]} mb "
                           f"{miss[1][1][1]} from {miss[1][1][3]} to {miss[1][1][4]}"
                           for r, (op, miss) in sorted(e.blocked.items()))
        raise ValueError(f"{s.name} pp {P} microbatches {s.microbatches} deadlocks "
                         f"({'strict' if strict else 'lenient'} semantics): {detail}")
    unmatched = sent ^ posted
    if unmatched:
        raise ValueError(f"{s.name}: transfers without a matching SEND/RECV: {sorted(unmatched)[:4]}")
    t = got.ops
    spans = [[(t[i].start, t[i].end, a) for i, a in computes[r]] for r in range(P)]
    post_spans = [[(t[i].start, t[i].end, a) for i, a in posts[r]] for r in range(P)]
    reached = [[t[i].reached for i, _ in computes[r]] for r in range(P)]
    makespan = max(got.lane_end[r] for r in range(P))
    busy = [sum(e - b for b, e, _ in spans[r]) for r in range(P)]
    return SimResult(s, cost, spans, makespan, busy, [makespan - b for b in busy], peak, post_spans, reached)


def simulate(schedule: Schedule, cost: Cost | None = None, timing: Timing | None = None) -> SimResult:
    """Timeline of one step under `cost` and, where given, measured `timing` (lenient semantics: a send never
    waits for its receiver)."""
    return run_dataflow(schedule, cost or Cost(), strict=False, timing=timing)
