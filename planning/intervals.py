"""Interval arithmetic on lists of (start, end) pairs (nanoseconds in practice), and the one
computation of a window's compute / comm / overlapped / exposed figures (`figures`; what each
counts is defined once, in partui/analysis/figures/definitions.py's table of figures): the engine's
per-step figures (step lines, rank cards, the run summary, World.step().to_pandas()) come from it,
and the trace analysis (partui.analysis.table.sweep, vectorized over many windows) counts the same span
categories the same way (CONTAINER_CATS, WAIT_CATS; tests pin the two equal on one traced step).

`merge` sorts and joins touching intervals; `subtract` and `intersect` expect merged lists.
"""
from __future__ import annotations

Intervals = list[tuple[int, int]]


def merge(intervals: Intervals) -> Intervals:
    """Sorted, with overlapping or touching intervals joined into one."""
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def subtract(x: Intervals, y: Intervals) -> Intervals:
    """Merged intervals x minus merged intervals y (a rank blocked in a wait is not computing)."""
    out, j = [], 0
    for start, end in x:
        while j < len(y) and y[j][1] <= start:
            j += 1
        k = j
        while k < len(y) and y[k][0] < end:
            if y[k][0] > start:
                out.append((start, y[k][0]))
            start = max(start, y[k][1])
            k += 1
        if start < end:
            out.append((start, end))
    return out


def length(intervals: Intervals) -> int:
    """Total length of (merged) intervals."""
    return sum(end - start for start, end in intervals)


def intersect(x: Intervals, y: Intervals) -> int:
    """Total length of the intersection of merged intervals x and y."""
    i = j = total = 0
    while i < len(x) and j < len(y):
        start, end = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        total += max(0, end - start)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


# span categories (kernels.comm.events.span's cat) that are structure around compute, never compute
CONTAINER_CATS = ("step", "FB", "microbatch")
# blocked on a comm op, or posting one: exposed, neither compute nor overlap
WAIT_CATS = ("wait", "post")


def clip(intervals: Intervals, t0: int, t1: int) -> Intervals:
    """The parts of intervals inside [t0, t1]."""
    return [(max(a, t0), min(b, t1)) for a, b in intervals if min(b, t1) > max(a, t0)]


def window_parts(leaf_compute: Intervals, in_flight: Intervals, waits: Intervals, t0: int, t1: int) -> dict:
    """What a window's figures are made of, cut to [t0, t1] and merged (small, plain: a rank ships it
    with its step): computing (leaf compute less waits and posts), in flight, wait length, window."""
    waiting = merge(clip(waits, t0, t1))
    return {"computing": subtract(merge(clip(leaf_compute, t0, t1)), waiting),
            "in_flight": merge(clip(in_flight, t0, t1)), "wait": length(waiting), "window": (t0, t1)}


def parts_figures(parts: dict, more_in_flight: Intervals = ()) -> dict:
    """One window's figures (partui.analysis.figures.definitions), lengths in the intervals' unit:
    compute = leaf compute spans merged, less waits and posts; comm = ops in flight (issue to
    completion) merged; overlapped = |compute & comm|; exposed = comm - overlapped; wait = waits
    and posts merged. `more_in_flight`: p2p ops paired across ranks (pair_p2p)."""
    t0, t1 = parts["window"]
    # pairs as tuples: parts that crossed a process as JSON (torchrun's gather) hold lists
    flying = merge([tuple(iv) for iv in parts["in_flight"]] + clip(list(more_in_flight), t0, t1))
    computing = [tuple(iv) for iv in parts["computing"]]
    comm, overlapped = length(flying), intersect(computing, flying)
    return {"window": t1 - t0, "compute": length(computing), "comm": comm,
            "overlapped": overlapped, "exposed": comm - overlapped, "wait": parts["wait"]}


def figures(leaf_compute: Intervals, in_flight: Intervals, waits: Intervals, t0: int, t1: int) -> dict:
    """One window's figures from its spans (parts_figures of window_parts); everything is cut to
    [t0, t1] first."""
    return parts_figures(window_parts(leaf_compute, in_flight, waits, t0, t1))


# the figures in ms, under the names the step lines, StepResult and `partui report` share
MS_NAMES = {"compute_ms": "compute", "comm_ms": "comm", "overlapped_ms": "overlapped",
            "exposed_comm_ms": "exposed", "wait_ms": "wait"}


def in_ms(f: dict) -> dict:
    """Figures in ns (parts_figures) as the named ms figures."""
    return {name: f[key] / 1e6 for name, key in MS_NAMES.items()}


def match_p2p(ops: list[tuple]) -> list[tuple[int, int]]:
    """The one p2p pairing across ranks: (send index, recv index) into `ops`, each op (op "send" /
    "recv", its rank, global peer, tag, issue time). The k-th send a->b with tag t, in issue order,
    pairs with the k-th recv on b from a with tag t; pairs in (sender, receiver, tag) order, so a
    trace's flow ids stay put."""
    sends: dict = {}
    recvs: dict = {}
    for i, (op, rank, peer, tag, _t) in enumerate(ops):
        if op == "send":
            sends.setdefault((rank, peer, tag), []).append(i)
        else:
            recvs.setdefault((peer, rank, tag), []).append(i)
    pairs = []
    for key in sorted(sends):
        # sorted is stable: ops issued at one time keep their recorded order
        ss = sorted(sends[key], key=lambda i: ops[i][4])
        rr = sorted(recvs.get(key, []), key=lambda i: ops[i][4])
        pairs += list(zip(ss, rr))
    return pairs


def paired_spans(send: tuple, recv: tuple, tie) -> tuple[tuple, tuple, bool, bool]:
    """A matched send's and recv's (start, end) while the pair is in flight, from the send's post to
    the recv's completion (one host, one clock), and whether each was moved. gloo's sends are seen
    complete only when their rank next looks, so a send ends at its recv's completion when that is
    earlier; a recv posted before its send moves nothing until then, so it starts `tie` (the
    clock's least step) after the send's post, within the recv."""
    (s0, s1), (r0, r1) = send, recv
    send_cut, recv_early = r1 < s1, r0 <= s0
    if send_cut:
        s1 = max(s0, r1)
    if recv_early:
        r0 = min(s0 + tie, r1)
    return (s0, s1), (r0, r1), send_cut, recv_early


def pair_p2p(p2p_by_rank: list) -> list[Intervals]:
    """Each rank's p2p ops in flight, paired across ranks as a trace pairs them (match_p2p,
    paired_spans; partui.recording.tracefile.fit_p2p_slices). p2p_by_rank[r]: rank r's ops (op "send" /
    "recv", global peer, tag, t_issue, t_end), in ns."""
    out = [[(a, b) for _op, _peer, _tag, a, b in ops] for ops in p2p_by_rank]
    where = [(rank, i) for rank, ops in enumerate(p2p_by_rank) for i in range(len(ops))]
    flat = [(op, rank, peer, tag, a) for rank, ops in enumerate(p2p_by_rank)
            for op, peer, tag, a, _b in ops]
    for si, ri in match_p2p(flat):
        (sr, sk), (rr, rk) = where[si], where[ri]
        out[sr][sk], out[rr][rk], _, _ = paired_spans(out[sr][sk], out[rr][rk], 1)  # 1 ns
    return out
