"""Which GPU kernels are communication, as frames: each row's family and the per-rank family table. The
one table of patterns is comm_families' (stdlib only, re-exported here); the counts are
gpu_kernels.family_rows', so the pandas-free report prints the same ones.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.gpu.comm_families import FAMILIES, USER, PatternError, family_names, family_patterns
from partui.analysis.gpu.comm_families import family_lines as lines_of
from partui.analysis.table.events import TraceError
from partui.analysis.gpu.gpu_kernels import family_rows
from partui.analysis.gpu.gpu_steps import kernels_of

__all__ = ["FAMILIES", "USER", "families", "family_of", "family_table", "family_lines"]
COLUMNS = ["rank", "family", "kernels", "kernel_ms"]


def families(extra=()) -> dict:
    """{family: compiled pattern}: the user's patterns first, then FAMILIES. A bad regex raises
    TraceError naming it."""
    try:
        return family_patterns(extra)
    except PatternError as exc:
        raise TraceError(str(exc)) from None


def family_of(names: pd.Series, gpu: np.ndarray, extra=()) -> np.ndarray:
    """Each row's comm family (object array; None where not a comm kernel), for GPU rows only:
    each distinct name is matched once (a trace has a few thousand names among millions of rows)."""
    families(extra)   # a bad pattern: TraceError
    cats = names.astype("category")
    labels = family_names(cats.cat.categories.tolist(), extra)
    codes = cats.cat.codes.to_numpy()
    out = np.array(labels + [None], dtype=object)[np.where(codes < 0, len(labels), codes)]
    out[~np.asarray(gpu, dtype=bool)] = None
    return out


def family_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per rank and family: comm kernels matched and their summed time (ms) of the kernels every view
    counts (gpu_kernels.family_rows); the patterns are the ones the trace was loaded with."""
    k = kernels_of(df, ("rank", "comm", "name", "dur"))
    if not k.comm.any():
        return pd.DataFrame(columns=COLUMNS)
    return pd.DataFrame(family_rows(k))[COLUMNS]


def family_lines(df: pd.DataFrame) -> list[str]:
    """The report's lines (comm_families.family_lines): which family matched how many kernels and how
    much time; a warning where a multi-rank job shows no comm kernel at all (never a silent 0)."""
    if not (df["device"] == "gpu").any():
        return []
    rows = family_table(df).itertuples(index=False)
    return lines_of(rows, int(df.attrs.get("world_size") or 1), df.attrs.get("path", "the trace"))
