"""Interval arithmetic on lists of (start, end) pairs (nanoseconds in practice), and the one
definition of a window's compute / comm / overlapped / exposed figures (`figures`): the engine's
per-step figures (step lines, rank cards, the run summary, World.step().to_pandas()) come from it,
and the trace analysis (partui.analysis.sweep, vectorized over many windows) counts the same span
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


def figures(leaf_compute: Intervals, in_flight: Intervals, waits: Intervals, t0: int, t1: int) -> dict:
    """One window's figures (partui.analysis.definitions), lengths in the intervals' unit:
    compute = leaf compute spans merged, less waits and posts; comm = ops in flight (issue to
    completion) merged; overlapped = |compute & comm|; exposed = comm - overlapped; wait = waits
    and posts merged; window = t1 - t0. Everything is cut to [t0, t1] first."""
    waiting = merge(clip(waits, t0, t1))
    computing = subtract(merge(clip(leaf_compute, t0, t1)), waiting)
    flying = merge(clip(in_flight, t0, t1))
    comm, overlapped = length(flying), intersect(computing, flying)
    return {"window": t1 - t0, "compute": length(computing), "comm": comm,
            "overlapped": overlapped, "exposed": comm - overlapped, "wait": length(waiting)}
