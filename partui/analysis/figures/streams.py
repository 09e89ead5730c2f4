"""GPU-side figures of a torch.profiler trace: per rank and per stream busy time, and per rank the
compute kernels (any stream, merged) against the comm kernels (merged), over the rank's GPU window.
The figures are gpu_kernels' (each kernel in the step that launched it; a step's GPU window its
kernels' first start to last end; a rank's figures its steps' summed), the main table's too, so both
read one comm, compute and overlap. Words: partui.analysis.figures.definitions (view GPU).

A comm kernel overlapping a compute kernel is "overlapped", not "hidden": DeepEP and NCCL kernels hold
SMs while they wait for remote data, so the compute beside them ran on fewer SMs. What no compute
kernel covered at all is gpu_exposed_comm_ms; compute_idle_ms is the window no compute kernel covered.
"""
from __future__ import annotations

import pandas as pd

from partui.analysis.figures.definitions import defined
from partui.analysis.gpu.gpu_kernels import gpu_rows, rank_sums, stream_rows
from partui.analysis.gpu.gpu_steps import SUMS, gpu_step_sums, kernels_of

STREAM_COLUMNS = ["rank", "stream", "kernels", "comm_kernels", "busy_ms", "comm_busy_ms", "busy_pct"]
GPU_COLUMNS = ["rank", "gpu_window_ms", "kernel_compute_ms", "kernel_comm_ms", "kernel_overlapped_ms",
               "gpu_exposed_comm_ms", "compute_idle_ms", "kernel_overlap_pct"]


def _per_rank(df: pd.DataFrame, sums: pd.DataFrame | None = None) -> dict:
    """gpu_kernels.rank_sums of the trace's step sums (sums: gpu_step_sums(df) where the caller has it)."""
    sums = gpu_step_sums(df) if sums is None else sums
    return rank_sums({c: sums[c].to_numpy() for c in SUMS})


def gpu_overlap(df: pd.DataFrame, sums: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank: gpu_kernels.gpu_rows (the GPU window, compute and comm kernels merged, their
    intersection, exposed on the GPU, compute idle). sums: gpu_step_sums(df) where the caller has it
    (one sweep of the kernels per report, not three)."""
    per = _per_rank(df, sums)
    if not len(per["rank"]):
        return defined(pd.DataFrame(columns=GPU_COLUMNS))
    return defined(pd.DataFrame(gpu_rows(per))[GPU_COLUMNS])


def stream_busy(df: pd.DataFrame, sums: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank and stream: gpu_kernels.stream_rows (kernels, comm kernels, busy, its comm part, busy as a
    % of the rank's GPU window). sums: as gpu_overlap's."""
    per = _per_rank(df, sums)
    k = kernels_of(df, ("rank", "comm", "stream", "ts", "end"))
    if not len(k.rank):
        return defined(pd.DataFrame(columns=STREAM_COLUMNS))
    return defined(pd.DataFrame(stream_rows(k, per))[STREAM_COLUMNS])
