"""Interval arithmetic on lists of (start, end) pairs (nanoseconds in practice): how the engine and
the benchmarks turn compute spans and comm in-flight times into compute / comm / overlap figures.

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
