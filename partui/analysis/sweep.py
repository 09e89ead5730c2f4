"""The interval arithmetic of the analysis: windows (a rank's steps, or its extent), intervals cut
to windows, and one vectorized sweep over +1/-1 boundaries for merged lengths, intersections and
unions (no Python loop per event)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.events import TraceError


def windows_of(df: pd.DataFrame, by_step: bool) -> pd.DataFrame:
    """[wid, rank, step, w0, w1]: step spans when there are any, else each rank's extent."""
    steps = df[df["kind"] == "step"]
    if len(steps):
        w = steps.groupby(["rank", "step"], as_index=False).agg(w0=("ts", "min"), w1=("end", "max"))
        if not by_step:
            w = w.groupby("rank", as_index=False).agg(w0=("w0", "min"), w1=("w1", "max"))
            w["step"] = np.nan
    else:
        if by_step:
            raise TraceError("no step spans in this trace (name 'step', cat 'step'); use --by rank")
        busy = df[df["kind"].isin(["compute", "comm", "wait"])]
        w = busy.groupby("rank", as_index=False).agg(w0=("ts", "min"), w1=("end", "max"))
        w["step"] = np.nan
    w = w.sort_values(["rank", "w0"]).reset_index(drop=True)
    w["wid"] = np.arange(len(w))
    return w[["wid", "rank", "step", "w0", "w1"]]


def clip_index(rank: np.ndarray, ts: np.ndarray, end: np.ndarray, windows: pd.DataFrame):
    """Intervals cut to the windows of their rank, as arrays: (rows, wid, ts, end), one entry per
    (interval, window) piece with something left, rows indexing the input. Windows of a rank are
    sorted and disjoint (windows_of, timing.pipeline_windows); pieces come rank by rank in the
    windows' rank order, within a rank in input order, an interval's pieces in window order. One
    searchsorted per rank over a contiguous slice: intervals already in rank order (the analysis
    table's) are not sorted again."""
    wrank = windows["rank"].to_numpy()
    if np.any(wrank[1:] < wrank[:-1]):  # a rank's windows together, each rank's in time order
        windows = windows.iloc[np.argsort(wrank, kind="stable")]
        wrank = windows["rank"].to_numpy()
    w0, w1 = windows["w0"].to_numpy(), windows["w1"].to_numpy()
    if not len(ts) or not len(wrank):
        none = np.zeros(0, dtype=np.int64)
        return none, none, np.zeros(0), np.zeros(0)
    order = None if np.all(rank[1:] >= rank[:-1]) else np.argsort(rank, kind="stable")
    r = rank if order is None else rank[order]
    t, e = (ts, end) if order is None else (ts[order], end[order])
    cuts = np.flatnonzero(np.r_[True, wrank[1:] != wrank[:-1], True])
    first = np.zeros(len(t), dtype=np.int64)
    last = np.full(len(t), -1, dtype=np.int64)   # no window of its rank: no piece
    lo = np.searchsorted(r, wrank[cuts[:-1]], side="left")
    hi = np.searchsorted(r, wrank[cuts[:-1]], side="right")
    for a, b, i, j in zip(cuts[:-1], cuts[1:], lo, hi):  # a loop per rank, vectorized inside
        if j > i:
            first[i:j] = a + np.searchsorted(w1[a:b], t[i:j], side="right")
            last[i:j] = a + np.searchsorted(w0[a:b], e[i:j], side="left") - 1
    n = last - first + 1                          # windows each interval meets (0 or less: none)
    if len(n) and n.min() == 1 and n.max() == 1:  # each in exactly one window: no gather at all
        at, k, t_at, e_at = np.arange(len(n)), first, t, e
    else:
        if len(n) and n.max() <= 1:               # each in one window at most: no repeats
            at = np.flatnonzero(n == 1)
            k = first[at]
        else:
            n = np.clip(n, 0, None)
            at = np.repeat(np.arange(len(n)), n)
            k = np.repeat(first, n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
        t_at, e_at = t[at], e[at]
    p0, p1 = np.maximum(t_at, w0[k]), np.minimum(e_at, w1[k])
    kept = p1 > p0
    if not kept.all():
        at, k, p0, p1 = at[kept], k[kept], p0[kept], p1[kept]
    rows = at if order is None else order[at]
    return rows, windows["wid"].to_numpy()[k], p0, p1


def clip(iv: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Cut intervals [ts, end] to the windows of their rank; one row per (interval, window) piece
    (clip_index), iv's other columns taken once."""
    rows, wid, ts, end = clip_index(iv["rank"].to_numpy(), iv["ts"].to_numpy(), iv["end"].to_numpy(), windows)
    piece = iv.take(rows)
    piece["ts"] = ts
    piece["end"] = end
    piece["wid"] = wid
    return piece


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


def union_lengths(key: np.ndarray, ts: np.ndarray, end: np.ndarray, rank: np.ndarray):
    """Per key: the merged length of its intervals, (keys, lengths). Intervals in (rank, start) order
    with keys rising within a rank, windows of a rank disjoint (what clip gives from the analysis
    table) take one pass, no sort: each adds what it reaches past the latest end before it in its rank
    (an earlier window's pieces end before a later one begins). Any other order takes the sweep."""
    rising = (np.all(np.diff(rank) >= 0) and np.all((np.diff(ts) >= 0) | (np.diff(rank) > 0))
              and np.all((np.diff(key) >= 0) | (np.diff(rank) > 0)))
    if not rising:
        keys, lengths, _, _ = sweep(key, ts, end, np.zeros(len(ts), dtype=np.int64), 1)
        return keys, lengths[:, 0]
    reach = np.full(len(ts), -np.inf)  # the latest end before each interval, within its rank
    cuts = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1], True]) if len(ts) else np.zeros(1, int)
    for a, b in zip(cuts[:-1], cuts[1:]):  # a loop per rank, vectorized inside
        reach[a + 1:b] = np.maximum.accumulate(end[a:b - 1])
    adds = np.maximum(0.0, end - np.maximum(ts, reach))
    keys, idx = np.unique(key, return_inverse=True)
    return keys, np.bincount(idx.ravel(), weights=adds, minlength=len(keys))


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
             for rows, k, count in _key_runs(key, chunk_rows)]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))


def _key_runs(key: np.ndarray, chunk_rows: int):
    """Runs of consecutive keys holding chunk_rows intervals at most, one at a time: (rows of the run,
    None, None), or (None, the key, its count) for one key longer than chunk_rows. A run's rows are
    found by one pass of masks over the keys (a byte a row), never by sorting them."""
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


_CLASSES = {"compute": 0, "comm": 1, "wait": 2}


def sweep_windows(df: pd.DataFrame, windows: pd.DataFrame, inner: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per window (index wid): merged compute, comm in flight, wait, compute-and-comm and their
    union, in us, with compute counted only outside waits. `inner` ([wid, w0, w1], a sub-window of
    some windows: the pipeline's) adds `inner_compute`, the compute inside it, from the same sweep
    (a fourth class whose intersection with compute is what it holds)."""
    kind = df["kind"]
    if isinstance(kind.dtype, pd.CategoricalDtype):  # test a few categories, not a million strings
        of = np.array([_CLASSES.get(c, -1) for c in kind.cat.categories] + [-1])
        cls = of[kind.cat.codes.to_numpy()]
    else:
        kind = kind.to_numpy(dtype=object)
        cls = np.select([kind == k for k in _CLASSES], list(_CLASSES.values()), -1)
    keep = np.flatnonzero(cls >= 0)
    rows, key, ts, end = clip_index(df["rank"].to_numpy()[keep], df["ts"].to_numpy()[keep],
                                    df["end"].to_numpy()[keep], windows)
    c = cls[keep[rows]]
    n_cls = len(_CLASSES)
    if inner is not None:
        n_cls += 1
        key = np.concatenate([key, inner["wid"].to_numpy()])
        ts, end = np.concatenate([ts, inner["w0"].to_numpy()]), np.concatenate([end, inner["w1"].to_numpy()])
        c = np.concatenate([c, np.full(len(inner), len(_CLASSES))])
    keys, lengths, inter0, union = sweep(key, ts, end, c, n_cls)
    z = pd.DataFrame(0.0, index=windows["wid"].to_numpy(),
                     columns=["compute", "comm", "wait", "overlapped", "union"])
    z.loc[keys, ["compute", "comm", "wait"]] = lengths[:, :3]
    z.loc[keys, "overlapped"] = inter0[:, 1]
    z.loc[keys, "union"] = union
    if inner is not None:
        z["inner_compute"] = 0.0
        z.loc[keys, "inner_compute"] = inter0[:, 3]
    return z
