"""HTA's launch filter (Trace.load_traces): which GPU events of a torch.profiler table HTA keeps, as a
mask over the table's rows, found a chunk of rows at a time: with two or more ProfilerStep#N, only
kernels launched (by correlation id) from CPU events that start before their rank's last step begins
(or, include_last_profiler_step, up to its end), CPU times rounded inward as HTA's parser does."""
from __future__ import annotations

import numpy as np
import pandas as pd


def hta_rows(df: pd.DataFrame, include_last_profiler_step: bool = False) -> np.ndarray:
    """Which rows of df are the GPU events HTA keeps, as a mask (see hta_overlap). Where every (rank,
    correlation) packs into an int64 (launched_by), the launches are packed and the kernels looked
    up LOOKUP_ROWS rows at a time: a few bytes a row held, not copies of the columns."""
    gpu_rows = (df["device"] == "gpu").to_numpy()
    steps = df.loc[~gpu_rows & _starts_with(df["name"], "ProfilerStep#"), ["rank", "name", "ts", "end"]]
    if steps["name"].nunique() < 2:  # HTA filters nothing with fewer than two steps
        return gpu_rows
    steps = steps.assign(ts=np.ceil(steps["ts"]), end=np.floor(steps["end"]))
    last = steps.groupby("rank").agg(start=("ts", "max"), end=("end", "max"))
    bound_of = last["end" if include_last_profiler_step else "start"]
    rank, ts, corr = df["rank"].to_numpy(), df["ts"].to_numpy(), df["correlation"].to_numpy()
    if not _packable(rank, corr):  # pandas' pairs, on whole copies of the columns
        cpu_rows = ~gpu_rows
        bound = pd.Series(rank[cpu_rows]).map(bound_of).to_numpy()
        start = np.ceil(ts[cpu_rows])
        kept = (start <= bound) if include_last_profiler_step else (start < bound)
        out = gpu_rows.copy()
        out[gpu_rows] = launched_by(rank[gpu_rows], corr[gpu_rows], rank[cpu_rows][kept], corr[cpu_rows][kept])
        return out
    launches = []
    for lo in range(0, len(df), LOOKUP_ROWS):  # the launches before the bound, packed
        at = slice(lo, lo + LOOKUP_ROWS)
        bound = pd.Series(rank[at]).map(bound_of).to_numpy()
        start = np.ceil(ts[at])
        kept = (start <= bound) if include_last_profiler_step else (start < bound)
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


LOOKUP_ROWS = 1 << 20  # rows of the table looked at a time by hta_rows


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


def launched_by(gpu_rank: np.ndarray, gpu_corr: np.ndarray, cpu_rank: np.ndarray,
                cpu_corr: np.ndarray) -> np.ndarray:
    """Per GPU event: whether a CPU event of its rank carries its correlation id (NaN matches nothing).
    Each (rank, id) pair is packed into one int64 when the ids are whole numbers under 2**40 and the ranks
    under 2**22, so one sorted np.isin answers; otherwise pandas matches the pairs."""
    cpu_corr_known = ~np.isnan(cpu_corr)
    cpu_rank, cpu_corr = cpu_rank[cpu_corr_known], cpu_corr[cpu_corr_known]
    gpu_known = ~np.isnan(gpu_corr)
    ids = np.concatenate([cpu_corr, gpu_corr[gpu_known]])
    ranks = np.concatenate([cpu_rank, gpu_rank])
    packable = (not len(ids) or (ids.min() >= 0 and ids.max() < 2 ** 40 and (ids == np.floor(ids)).all()
                                 and ranks.min() >= 0 and ranks.max() < 2 ** 22))
    if not packable:
        launched = pd.MultiIndex.from_arrays([cpu_rank, cpu_corr])
        return pd.MultiIndex.from_arrays([gpu_rank, gpu_corr]).isin(launched)
    pack = lambda rank, corr: (rank.astype(np.int64) << 40) | corr.astype(np.int64)
    out = np.zeros(len(gpu_rank), bool)
    out[gpu_known] = np.isin(pack(gpu_rank[gpu_known], gpu_corr[gpu_known]), pack(cpu_rank, cpu_corr))
    return out
