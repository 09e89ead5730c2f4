"""The interval arithmetic of the analysis: windows (a rank's steps, or its extent), intervals cut
to windows, and per window the merged lengths, intersections and unions of one vectorized sweep over
+1/-1 boundaries (boundary_sweep.sweep, which every caller takes from here; no Python loop per event)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.table.boundary_sweep import sweep
from partui.analysis.table.events import TraceError


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
