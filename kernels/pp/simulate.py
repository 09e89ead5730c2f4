"""Replay a schedule's action lists as a dataflow under a cost model: timeline, bubble, activations held.

Semantics (the ones kernels.pp.schedules documents; data model: kernels.pp.actions): ranks walk their lists
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
Activations held = forwards whose backward-input has not run yet (an FB pair counts its forward first).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kernels.pp.actions import COMM_KINDS, COMPUTE_KINDS, Action, Schedule


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


@dataclass
class SimResult:
    schedule: Schedule
    cost: Cost
    spans: list[list[tuple[float, float, Action]]]  # per rank: (start, end, compute action)
    makespan: float
    busy: list[float]
    bubble_per_rank: list[float]
    peak_activations: list[int]

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


def run_dataflow(s: Schedule, cost: Cost, strict: bool = False) -> SimResult:
    """Execute all ranks' lists as a dataflow; raise ValueError on a deadlock or a missing/misplaced transfer."""
    P = s.pp
    dur = {"F": cost.F, "B": cost.B - cost.W if s.split_w else cost.B, "W": cost.W, "BW": cost.B, "FB": cost.fb}
    dur = {k: v * s.cost_scale for k, v in dur.items()}
    idx, clock = [0] * P, [0.0] * P
    spans = [[] for _ in range(P)]
    held, peak = [0] * P, [0] * P
    done = set()                                 # (part, stage, mb) finished locally
    sent, posted = {}, {}                        # transfer key -> time the SEND / RECV was posted
    open_recvs = [set() for _ in range(P)]       # posted, not yet waited
    open_sends = [set() for _ in range(P)]
    waiting = {}                                 # transfer key -> rank blocked on it
    ready = deque(range(P))
    blocked = {}

    def key_of(rank, a, part, mb, chunk, send):
        stage = s.stage_of(rank, chunk)
        step = 1 if part == "F" else -1              # direction data flows in
        peer = s.holder(stage + step if send else stage - step, mb)[0]
        producer = stage if send else stage - step
        return (part, mb, producer, rank, peer) if send else (part, mb, producer, peer, rank)

    def needs(rank, a):
        """Remote transfer keys a compute consumes; raises if a local input is not produced yet."""
        keys = []
        for part, mb, chunk in _parts(a):
            stage = s.stage_of(rank, chunk)
            if part == "W":
                continue
            src_stage = stage - 1 if part == "F" else stage + 1
            if not 0 <= src_stage < s.stages:
                continue
            src, _ = s.holder(src_stage, mb)
            if src == rank:
                if (part, src_stage, mb) not in done:
                    raise ValueError(f"{s.name} rank {rank}: {a} needs stage {src_stage}'s {part} of microbatch "
                                     f"{mb}, which this rank runs later in its list")
                continue
            k = (part, mb, src_stage, src, rank)
            if k not in posted:
                raise ValueError(f"{s.name} rank {rank}: {a} needs data from rank {src} but no RECV_{part} "
                                 f"was posted before it")
            keys.append(k)
        return keys

    while ready:
        r = ready.popleft()
        seq = s.actions[r]
        while idx[r] < len(seq):
            a = seq[idx[r]]
            if a.kind in COMM_KINDS:
                part, send = a.kind[-1], a.kind.startswith("SEND")
                k = key_of(r, a, part, a.mb, a.chunk, send)
                book = sent if send else posted
                if k in book:
                    raise ValueError(f"{s.name} rank {r}: {a} posted twice")
                if send and (part, s.stage_of(r, a.chunk), a.mb) not in done:
                    raise ValueError(f"{s.name} rank {r}: {a} comes before the compute that produces its data")
                book[k] = clock[r]
                (open_sends if send else open_recvs)[r].add(k)
                if k in waiting:
                    ready.append(waiting.pop(k))
                idx[r] += 1
                continue
            inputs = needs(r, a)
            wait_recv = set(open_recvs[r]) if strict else set(inputs)
            wait_send = open_sends[r] if strict else set()
            missing = [k for k in wait_recv if k not in sent] + [k for k in wait_send if k not in posted]
            if missing:
                waiting[missing[0]] = r
                blocked[r] = (a, missing[0])
                break
            blocked.pop(r, None)
            start = max([clock[r]] + [sent[k] + cost.p2p for k in wait_recv] + [posted[k] for k in wait_send])
            end = start + dur[a.kind]
            spans[r].append((start, end, a))
            clock[r] = end
            open_recvs[r] -= wait_recv
            if strict:
                open_sends[r].clear()
            for part, mb, chunk in _parts(a):
                done.add((part, s.stage_of(r, chunk), mb))
                if part == "F":
                    held[r] += 1
                    peak[r] = max(peak[r], held[r])
                elif part == "B":
                    held[r] -= 1
            idx[r] += 1
    stuck = [r for r in range(P) if idx[r] < len(s.actions[r])]
    if stuck:
        detail = "; ".join(f"rank {r} at {blocked[r][0]} waits for {'RECV' if blocked[r][1] in sent else 'SEND'} "
                           f"of {blocked[r][1][0]} mb {blocked[r][1][1]} from {blocked[r][1][3]} to {blocked[r][1][4]}"
                           for r in stuck if r in blocked)
        raise ValueError(f"{s.name} pp {P} microbatches {s.microbatches} deadlocks "
                         f"({'strict' if strict else 'lenient'} semantics): {detail}")
    unmatched = set(sent) ^ set(posted)
    if unmatched:
        raise ValueError(f"{s.name}: transfers without a matching SEND/RECV: {sorted(unmatched)[:4]}")
    makespan = max(clock)
    busy = [sum(e - b for b, e, _ in spans[r]) for r in range(P)]
    return SimResult(s, cost, spans, makespan, busy, [makespan - b for b in busy], peak)


def simulate(schedule: Schedule, cost: Cost | None = None) -> SimResult:
    """Timeline of one step under `cost` (lenient semantics: sends never delay their sender)."""
    return run_dataflow(schedule, cost or Cost(), strict=False)


def formula_bubble(name: str, pp: int, cost: Cost, virtual: int = 1) -> tuple[float, str]:
    """The published bubble for a schedule (largest over ranks for DualPipe/V), and its formula as text."""
    F, B, W, FB = cost.F, cost.B, cost.W, cost.fb
    key = name.lower()
    if key in ("gpipe", "1f1b"):
        return (pp - 1) * (F + B), "(P-1)(F+B)"
    if key == "interleaved":
        return (pp - 1) * (F + B) / virtual, "(P-1)(F+B)/v"
    if key in ("zb1p", "zero-bubble"):
        return (pp - 1) * (F + B - 2 * W), "(P-1)(F+B-2W)"
    if key == "dualpipe":
        return (pp / 2 - 1) * (FB + B - 3 * W), "(P/2-1)(F&B+B-3W)"
    if key == "dualpipev":      # the README's PP counts stages: 2 per rank, so PP/2-1 = ranks-1
        return (pp - 1) * (FB + B - 3 * W), "(S/2-1)(F&B+B-3W), S=2P stages"
    raise ValueError(f"no bubble formula for schedule {name!r}")


_ANSI = {("F", 0): "38;5;117", ("F", 1): "38;5;222", ("B", 0): "1;38;5;27", ("B", 1): "1;38;5;166",
         ("W", 0): "38;5;245", ("W", 1): "38;5;245", ("FB", 0): "1;38;5;135", ("FB", 1): "1;38;5;135"}


def text_timeline(result: SimResult, width: int = 160, color: bool = False) -> str:
    """The schedule grid: a row per rank, a cell per time quantum holding the microbatch of the action that runs
    then ('·' idle), and a legend line with the largest bubble, the published formula and activations held."""
    s = result.schedule
    durations = [e - b for spans in result.spans for b, e, _ in spans if e > b]
    cell = len(str(s.microbatches - 1)) + 1
    quantum = min(durations) if durations else 1.0
    quantum = max(quantum, result.makespan / max(1, width // cell))   # at most `width` characters a row
    columns = int(round(result.makespan / quantum + 0.4999)) if result.makespan else 0
    label = len(str(s.pp - 1))
    rows = []
    for r, spans in enumerate(result.spans):
        cells, j = [], 0
        for c in range(columns):
            mid = (c + 0.5) * quantum
            while j < len(spans) and spans[j][1] <= mid:
                j += 1
            if j < len(spans) and spans[j][0] <= mid:
                a = spans[j][2]
                text = str(a.mb).rjust(cell)
                if color:
                    kind = "FB" if a.kind == "FB" else "B" if a.kind == "BW" else a.kind
                    direction = s.direction_of(a.mb) if s.directions == 2 else int(a.chunk > 0)
                    text = f"\x1b[{_ANSI[(kind, direction)]}m{text}\x1b[0m"
            else:
                text = "·".rjust(cell)
            cells.append(text)
        rows.append(f"rank {str(r).rjust(label)} │" + "".join(cells))
    virtual = s.chunks_per_rank if s.name == "interleaved" else 1
    formula, text = formula_bubble(s.name, s.pp, result.cost, virtual)
    pct = 100 * result.bubble / result.makespan if result.makespan else 0.0
    rows.append(f"{' ' * (label + 6)} bubble {result.bubble:g} = {pct:.1f}% (rank {result.bubble_rank}) · formula "
                f"{text} = {formula:g} · activations held ≤ {max(result.peak_activations)}"
                + (" · F light, B dark, W grey, FB purple, 2nd direction/chunk warm" if color else ""))
    return "\n".join(rows)
