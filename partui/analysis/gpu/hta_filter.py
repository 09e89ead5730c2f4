"""HTA's launch filter (Trace.load_traces): which GPU events of a torch.profiler table HTA keeps, as a
mask over the table's rows, found a chunk of rows at a time: with two or more ProfilerStep#N, only
kernels launched (by correlation id) from CPU events that start before their rank's last step begins
(or, include_last_profiler_step, up to its end), CPU times rounded inward as HTA's parser does."""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.gpu import kineto_kinds
from partui.analysis.gpu.gpu_kernels import hta_bounds, hta_launches, launched_by


def hta_rows(df: pd.DataFrame, include_last_profiler_step: bool = False) -> np.ndarray:
    """Which rows of df are the GPU events HTA keeps, as a mask (see hta_overlap). Where every (rank,
    correlation) packs into an int64 (launched_by), the launches are packed and the kernels looked
    up LOOKUP_ROWS rows at a time: a few bytes a row held, not copies of the columns."""
    gpu_rows = (df["device"] == "gpu").to_numpy()
    steps = df.loc[~gpu_rows & _starts_with(df["name"], kineto_kinds.STEP_PREFIX), ["rank", "name", "ts", "end"]]
    if steps["name"].nunique() < 2:  # HTA filters nothing with fewer than two steps
        return gpu_rows
    bounds = hta_bounds(steps["rank"].to_numpy(), steps["ts"].to_numpy(dtype=float),
                        steps["end"].to_numpy(dtype=float), include_last_profiler_step)
    rank, ts, corr = df["rank"].to_numpy(), df["ts"].to_numpy(), df["correlation"].to_numpy()
    if not _packable(rank, corr):  # launched_by numbers the pairs, on whole copies of the columns
        cpu_rows = ~gpu_rows
        kept = hta_launches(rank[cpu_rows], ts[cpu_rows], bounds, include_last_profiler_step)
        out = gpu_rows.copy()
        out[gpu_rows] = launched_by(rank[gpu_rows], corr[gpu_rows], rank[cpu_rows][kept], corr[cpu_rows][kept])
        return out
    launches = []
    for lo in range(0, len(df), LOOKUP_ROWS):  # the launches before the bound, packed
        at = slice(lo, lo + LOOKUP_ROWS)
        kept = hta_launches(rank[at], ts[at], bounds, include_last_profiler_step)
        kept &= ~gpu_rows[at] & ~np.isnan(corr[at])
        launches.append(_pack(rank[at][kept], corr[at][kept]))
    launches = np.concatenate(launches)
    launches.sort()  # in place; repeats do no harm to a lookup (np.unique hashes, ~10x slower)
    out = np.zeros(len(df), bool)
    if not len(launches):
        return out
    for lo in range(0, len(df), LOOKUP_ROWS):  # each kernel's (rank, id) among them
        at = slice(lo, lo + LOOKUP_ROWS)
        mine = np.flatnonzero(gpu_rows[at] & ~np.isnan(corr[at]))
        key = _pack(rank[at][mine], corr[at][mine])
        k = np.searchsorted(launches, key)
        np.minimum(k, len(launches) - 1, out=k)
        out[lo + mine[launches[k] == key]] = True
    return out


LOOKUP_ROWS = kineto_kinds.LOOKUP_ROWS  # rows of the table looked at a time by hta_rows (tests shrink it)


def _starts_with(name: pd.Series, prefix: str) -> np.ndarray:
    """name.str.startswith(prefix) as a bool array, NaN False; a categorical's categories tested once."""
    if isinstance(name.dtype, pd.CategoricalDtype):
        hit = np.append(name.cat.categories.astype(str).str.startswith(prefix), False)  # code -1: False
        return hit[name.cat.codes.to_numpy()]
    return name.str.startswith(prefix).fillna(False).to_numpy(dtype=bool)


def _packable(rank: np.ndarray, corr: np.ndarray) -> bool:
    """Whether every (rank, correlation) of these columns packs into one int64 (_pack): ranks under
    2**22, ids whole numbers under 2**40 (NaN aside), checked a chunk at a time."""
    if not len(rank):
        return True
    if rank.min() < 0 or rank.max() >= 2 ** 22 or np.nanmin(corr, initial=np.inf) < 0 \
            or np.nanmax(corr, initial=-np.inf) >= 2 ** 40:
        return False
    return all(bool(np.all((c == np.floor(c)) | np.isnan(c)))
               for c in (corr[lo:lo + LOOKUP_ROWS] for lo in range(0, len(corr), LOOKUP_ROWS)))


def _pack(rank: np.ndarray, corr: np.ndarray) -> np.ndarray:
    return (rank.astype(np.int64) << 40) | corr.astype(np.int64)
