"""The one sweep over +1/-1 boundaries that every merged length of the analysis comes from: per key,
each class's intervals merged, each class's intersection with class 0, the union of classes 0 and 1.
More than CHUNK_ROWS intervals are swept a run of keys at a time, a key longer than that a piece of
its time at a time, carrying what is open across each cut: the same figures bit for bit, in memory
set by the chunk, not by the trace (issue 36: a 3 GB torch.profiler trace)."""
from __future__ import annotations

import numpy as np


def sort_by_key_then_time(k: np.ndarray, t: np.ndarray, kind: str = "quicksort") -> np.ndarray:
    """The order of (k, t), faster than np.lexsort: t by `kind` (time_sort_kind), then k by stable radix
    passes of 16 bits (one, or two for keys under 2**32). Ties in both may come out in any order, which
    no merged length sees (the segment between equal times is 0)."""
    if not len(k) or k.min() < 0 or k.max() >= 2**32:
        return np.lexsort((t, k))
    o = np.argsort(t, kind=kind)
    # each 16-bit digit made once (2 bytes a row) and then reordered: never an int64 copy of k reordered
    if k.max() >= 2**16:
        digit = (k & 0xFFFF).astype(np.uint16)
        o = o[np.argsort(digit[o], kind="stable")]
        digit = (k >> 16).astype(np.uint16)
        return o[np.argsort(digit[o], kind="stable")]
    digit = k.astype(np.uint16)
    return o[np.argsort(digit[o], kind="stable")]


def time_sort_kind(ts: np.ndarray) -> str:
    """How to sort boundaries whose starts are ts: "stable" (timsort, ~2.5x faster than quicksort on
    1M kernels' starts then ends) where the starts come nearly in time order, as the analysis table's
    rows do (a descent at most every 256 rows); quicksort where they are shuffled (2x faster there)."""
    return "stable" if np.count_nonzero(ts[1:] < ts[:-1]) <= len(ts) // 256 else "quicksort"


CHUNK_ROWS = 1 << 18  # intervals swept at a time: the sweep's temporaries, ~130 bytes a row, stay this size
# (~35 MB); smaller chunks sort no slower (1M kernels: the same time at 2**17 to 2**20 rows a chunk)


def sweep(key: np.ndarray, ts: np.ndarray, end: np.ndarray, cls: np.ndarray, n_cls: int,
          chunk_rows: int | None = None):
    """Per key: merged length of each class, of each class's intersection with class 0, and of
    the union of classes 0 and 1 (compute and comm). With a third class (waits), class 0 counts
    only while no wait is open: a blocking op inside an "F+B" span is exposed, not overlapped.
    Returns (keys, lengths[key, cls], inter0[key, cls], union[key]), keys rising. Intervals end at
    or after they start. More than chunk_rows intervals are swept a run of keys at a time (a key
    longer than that, a piece of its time at a time): the same figures bit for bit, in memory that
    does not grow with the trace (chunk_rows: CHUNK_ROWS unless given)."""
    chunk_rows = chunk_rows or CHUNK_ROWS
    if len(ts) <= chunk_rows:
        return _sweep_rows(key, ts, end, cls, n_cls)
    parts = [_sweep_rows(key[rows], ts[rows], end[rows], cls[rows], n_cls) if rows is not None
             else _sweep_long_key(key, ts, end, cls, n_cls, k, count, chunk_rows)
             for rows, k, count in key_runs(key, chunk_rows)]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))


def key_runs(key: np.ndarray, chunk_rows: int):
    """Runs of consecutive keys holding chunk_rows intervals at most, one at a time: (rows of the run,
    None, None), or (None, the key, its count) for one key longer than chunk_rows. Keys are counted by
    bincount (by a sort where they are negative, sparse or not integers); a run's rows are found by one
    pass of masks over the keys (a byte a row), never by sorting them."""
    lo, hi = key.min(), key.max()
    if key.dtype.kind in "iu" and lo >= 0 and hi < 4 * len(key) + (1 << 16):  # codes, ranks, window ids: counted in place
        counts = np.bincount(key, minlength=hi + 1)
        present = np.flatnonzero(counts)
        counts = counts[present]
    else:  # by a sort: np.unique hashes, ~10x slower on millions
        present = np.sort(key)
        first = np.flatnonzero(np.r_[True, present[1:] != present[:-1]])
        counts = np.diff(np.r_[first, len(present)])
        present = present[first]
    ends = np.cumsum(counts)
    a = 0
    while a < len(present):
        b = max(a + 1, int(np.searchsorted(ends, ends[a] - counts[a] + chunk_rows, side="right")))
        if b == a + 1 and counts[a] > chunk_rows:
            yield None, present[a], int(counts[a])
        else:
            inside = key >= present[a]
            inside &= key <= present[b - 1]
            yield np.flatnonzero(inside), None, None
        a = b


def _sweep_long_key(key, ts, end, cls, n_cls, k, count: int, chunk_rows: int):
    """One key's sweep, a piece of time at a time: the boundaries in [cut_j-1, cut_j) sorted and swept
    from where the piece before left off (each class's depth, the last boundary's time, the sums so
    far added first), so the figures are the one sweep's bit for bit. The cuts are quantiles of a
    sample of its starts, ~chunk_rows intervals' boundaries a piece; a piece they leave long is only
    slower, never wrong. Each row's piece (of its start, of its end) is kept in two bytes, so a piece's
    boundaries are found by one pass over them."""
    mine = key == k
    stride = max(1, len(ts) // (1 << 16))
    sample = np.sort(ts[::stride][mine[::stride]])
    pieces = count // chunk_rows + 1
    cuts = np.unique(sample[np.linspace(0, len(sample) - 1, pieces + 1).astype(np.int64)[1:-1]]) \
        if len(sample) else np.zeros(0)
    start_piece, end_piece = _piece_of(ts, cuts, mine), _piece_of(end, cuts, mine)
    del mine
    carry = None
    for j in range(len(cuts) + 1):
        starts, ends = np.flatnonzero(start_piece == j), np.flatnonzero(end_piece == j)
        if not len(starts) + len(ends):
            continue
        t = np.concatenate([ts[starts], end[ends]])
        order = np.argsort(t, kind=time_sort_kind(t[:len(starts)]))
        step = (order < len(starts)).astype(np.int8)
        step *= 2
        step -= 1
        c = np.concatenate([cls[starts].astype(np.int8), cls[ends].astype(np.int8)])[order]
        carry = _sweep_sorted(np.zeros(len(t), np.int8), t[order], step, c, n_cls, carry)[4]
    depth, last, lengths, inter0, union = carry
    return (np.array([k], dtype=key.dtype), lengths[None, :], inter0[None, :], np.array([union]))


def _piece_of(t: np.ndarray, cuts: np.ndarray, mine: np.ndarray) -> np.ndarray:
    """Per row, the piece its time falls in (the cuts at or before it); -1 for rows of other keys."""
    out = np.empty(len(t), np.int16 if len(cuts) < 2 ** 15 - 1 else np.int32)
    for lo in range(0, len(t), 1 << 20):
        out[lo:lo + (1 << 20)] = np.searchsorted(cuts, t[lo:lo + (1 << 20)], side="right")
    out[~mine] = -1
    return out


def _sweep_rows(key, ts, end, cls, n_cls):
    """The sweep of all its intervals at once: their 2m boundaries sorted by (key, time)."""
    m = len(ts)
    # each row-length temporary freed as soon as it is spent: on millions of kernels the sweep's
    # arrays, not the table, set the report's peak memory
    t = np.concatenate([ts, end])
    k = np.concatenate([key, key])
    order = sort_by_key_then_time(k, t, time_sort_kind(ts))
    t = t[order]
    k = k[order]
    step = (order < m).astype(np.int8)    # +1 at a start, -1 at an end
    step *= 2
    step -= 1
    cls8 = cls.astype(np.int8)            # a handful of classes: a byte each
    c = np.concatenate([cls8, cls8])[order]
    del order, cls8
    return _sweep_sorted(k, t, step, c, n_cls)[:4]


def _sweep_sorted(k, t, step, c, n_cls, carry=None):
    """The sweep of boundaries sorted by (key, time): k, t, step (+1 / -1), c (class). carry: where
    the same key's sweep left off ((depth per class, last time, lengths, inter0, union) of one key),
    whose boundaries these continue. Returns (keys, lengths, inter0, union, the last key's carry)."""
    new_key = np.r_[True, k[1:] != k[:-1]] if len(k) else np.zeros(0, dtype=bool)
    keys = k[new_key]
    del k
    n = len(keys)
    if not n:
        return keys, np.zeros((0, n_cls)), np.zeros((0, n_cls)), np.zeros(0), carry
    idx = np.cumsum(new_key)              # each boundary's key, without a second sort
    idx -= 1
    seg = np.diff(t, append=t[-1:])
    seg[np.r_[new_key[1:], True]] = 0.0   # no segment across keys
    del new_key
    # each interval adds +1 then -1, so a class's depth is 0 between keys
    depth = [np.cumsum(step * (c == j), dtype=np.int32) for j in range(n_cls)]  # bytes in, 4x faster
    if carry is not None:
        for j in range(n_cls):
            depth[j] += carry[0][j]
        # the segment from the carried last boundary to this first one, open as the carry left it, is
        # added to the carried sums ahead of this key's first weight: one unbroken sum, bit for bit
        cross, was = t[0] - carry[1], _open([d > 0 for d in carry[0]])
    on = _open([d > 0 for d in depth])

    def summed(o, part, j, was_on):
        w = seg * o
        if carry is not None:
            w[0] = ((carry[part] if j is None else carry[part][j]) + cross * was_on) + w[0]
        return np.bincount(idx, weights=w, minlength=n)  # in order: np.add.at is ~10x slower

    resumed = carry is not None
    lengths = np.stack([summed(on[j], 2, j, resumed and was[j]) for j in range(n_cls)], axis=1)
    # class 0 with itself is class 0, and with one class the union is it: the same sums, not summed again
    inter0 = np.stack([lengths[:, 0]] + [summed(on[j] & on[0], 3, j, resumed and was[j] and was[0])
                                         for j in range(1, n_cls)], axis=1)
    union = summed(on[0] | on[1], 4, None, resumed and (was[0] or was[1])) if n_cls > 1 else lengths[:, 0].copy()
    after = (np.array([d[-1] for d in depth], np.int32), t[-1], lengths[-1], inter0[-1], union[-1])
    return keys, lengths, inter0, union, after


def _open(on: list) -> list:
    """Each class open (depth > 0), class 0 not while a wait (class 2) is open: a rank blocked in a
    wait is not computing, even inside a compute span."""
    if len(on) > 2:
        on[0] = on[0] & ~on[2]
    return on
