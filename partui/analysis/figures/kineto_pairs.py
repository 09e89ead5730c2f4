"""`partui report --by pair` on a torch.profiler trace read as the analysis table: the table's columns
handed to pair_parts (where every figure is computed, on plain arrays; the pandas-free report hands it
kineto_lean's arrays instead), and the rows back as a frame."""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.gpu.gpu_steps import counted_kernels, launch_times
from partui.analysis.gpu.pair_parts import (COLUMNS, Annotations, PairsRead, is_part_name, pair_summary,
                                            read_pairs)


def annotations_of(df: pd.DataFrame) -> Annotations:
    """The table's CPU user annotations."""
    cpu = df[(df["device"] == "cpu") & (df["cat"] == "user_annotation")]  # categorical: codes compared
    return Annotations(rank=cpu["rank"].to_numpy(dtype=np.int64), ts=cpu["ts"].to_numpy(dtype=float),
                       end=cpu["end"].to_numpy(dtype=float), dur=cpu["dur"].to_numpy(dtype=float),
                       name=cpu["name"].astype(str).tolist())


def frame_pairs(df: pd.DataFrame) -> PairsRead:
    """pair_parts.read_pairs of the table: its user annotations, the kernels every view counts
    (gpu_steps.counted_kernels) and their launches (gpu_steps.launch_times)."""
    gpu = counted_kernels(df, ["rank", "kind", "ts", "end", "correlation"])
    return read_pairs(annotations_of(df), gpu["rank"].to_numpy(), gpu["ts"].to_numpy(), gpu["end"].to_numpy(),
                      (gpu["kind"] == "comm").to_numpy(), launch_times(df, gpu))


def kineto_pairs(df: pd.DataFrame) -> pd.DataFrame:
    """One row per part annotation (pair_parts.COLUMNS); empty without part annotations."""
    return pair_frame(frame_pairs(df).table)


def pair_frame(table: dict) -> pd.DataFrame:
    return pd.DataFrame(table, columns=COLUMNS)


def kineto_pair_summary(table: pd.DataFrame) -> str:
    """pair_parts.pair_summary of a kineto_pairs frame."""
    return pair_summary({c: table[c].tolist() for c in COLUMNS})


def is_part_trace(df: pd.DataFrame) -> bool:
    """A torch.profiler trace with part annotations (then --by pair reads them)."""
    if df.attrs.get("format") != "kineto":
        return False
    names = df.loc[df["cat"] == "user_annotation", "name"]
    names = names.cat.remove_unused_categories().cat.categories if isinstance(names.dtype, pd.CategoricalDtype) \
        else names.unique()
    return any(is_part_name(str(n)) for n in names)
