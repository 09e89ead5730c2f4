"""The one vectorized interval sweep, numpy only: merged lengths, intersections and unions per key from
+1/-1 boundaries, no Python loop per event. The pandas-free half of sweep.py (whose windows and clipping
read frames), so a GPU report computed without pandas (gpu_kernels) sweeps with the same code."""
from __future__ import annotations

import numpy as np


def sort_by_key_then_time(k: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The order of (k, t), faster than np.lexsort: t by quicksort, then k by stable radix passes of
    16 bits (one, or two for keys under 2**32). Ties in both may come out in any order, which no
    merged length sees (the segment between equal times is 0)."""
    if not len(k) or k.min() < 0 or k.max() >= 2**32:
        return np.lexsort((t, k))
    o = np.argsort(t)
    # each 16-bit digit made once (2 bytes a row) and then reordered: never an int64 copy of k reordered
    if k.max() >= 2**16:
        digit = (k & 0xFFFF).astype(np.uint16)
        o = o[np.argsort(digit[o], kind="stable")]
        digit = (k >> 16).astype(np.uint16)
        return o[np.argsort(digit[o], kind="stable")]
    digit = k.astype(np.uint16)
    return o[np.argsort(digit[o], kind="stable")]


def sweep(key: np.ndarray, ts: np.ndarray, end: np.ndarray, cls: np.ndarray, n_cls: int):
    """Per key: merged length of each class, of each class's intersection with class 0, and of
    the union of classes 0 and 1 (compute and comm). With a third class (waits), class 0 counts
    only while no wait is open: a blocking op inside an "F+B" span is exposed, not overlapped.
    Returns (keys, lengths[key, cls], inter0[key, cls], union[key])."""
    m = len(ts)
    # each row-length temporary freed as soon as it is spent: on millions of kernels the sweep's
    # arrays, not the table, set the report's peak memory
    t = np.concatenate([ts, end])
    k = np.concatenate([key, key])
    order = sort_by_key_then_time(k, t)
    t = t[order]
    k = k[order]
    step = (order < m).astype(np.int8)    # +1 at a start, -1 at an end
    step *= 2
    step -= 1
    cls8 = cls.astype(np.int8)            # a handful of classes: a byte each
    c = np.concatenate([cls8, cls8])[order]
    del order, cls8
    new_key = np.r_[True, k[1:] != k[:-1]] if len(k) else np.zeros(0, dtype=bool)
    keys = k[new_key]
    del k
    idx = np.cumsum(new_key)              # each boundary's key, without a second sort
    idx -= 1
    seg = np.diff(t, append=t[-1:] if len(t) else t)
    del t
    if len(seg):
        seg[np.r_[new_key[1:], True]] = 0.0   # no segment across keys
    del new_key
    # each interval adds +1 then -1, so a class's depth is 0 between keys
    on = [np.cumsum(step * (c == j), dtype=np.int32) > 0 for j in range(n_cls)]  # bytes in, 4x faster
    if n_cls > 2:  # a rank blocked in a wait is not computing, even inside a compute span
        on[0] = on[0] & ~on[2]
    n = len(keys)
    # bincount per class: np.add.at is ~10x slower on a million boundaries
    lengths = np.stack([np.bincount(idx, weights=seg * o, minlength=n) for o in on], axis=1) \
        if n else np.zeros((0, n_cls))
    inter0 = np.stack([np.bincount(idx, weights=seg * (o & on[0]), minlength=n) for o in on], axis=1) \
        if n else np.zeros((0, n_cls))
    union = np.bincount(idx, weights=seg * (on[0] | on[1] if n_cls > 1 else on[0]), minlength=n) \
        if n else np.zeros(0)
    return keys, lengths, inter0, union
