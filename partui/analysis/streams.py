"""GPU-side figures of a torch.profiler trace: per rank and per stream busy time, and per rank the
compute kernels (any stream, merged) against the comm kernels (merged), over the rank's GPU window.
The kernels and windows are gpu_steps' (each kernel in the step that launched it; a step's GPU window its
kernels' first start to last end; a rank's figures its steps' summed), the main table's too, so both
read one comm, compute and overlap. Words: partui.analysis.definitions (view GPU).

A comm kernel overlapping a compute kernel is "overlapped", not "hidden": DeepEP and NCCL kernels hold
SMs while they wait for remote data, so the compute beside them ran on fewer SMs. What no compute
kernel covered at all is gpu_exposed_comm_ms; compute_idle_ms is the window no compute kernel covered.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.definitions import defined
from partui.analysis.gpu_steps import counted_rows, gpu_step_sums
from partui.analysis.sweep import sweep

US_MS = 1e-3
STREAM_COLUMNS = ["rank", "stream", "kernels", "comm_kernels", "busy_ms", "comm_busy_ms", "busy_pct"]
GPU_COLUMNS = ["rank", "gpu_window_ms", "kernel_compute_ms", "kernel_comm_ms", "kernel_overlapped_ms",
               "gpu_exposed_comm_ms", "compute_idle_ms", "kernel_overlap_pct"]


def _windows(df: pd.DataFrame, sums: pd.DataFrame | None = None) -> pd.Series:
    """Per rank: its steps' GPU windows summed (us)."""
    return (gpu_step_sums(df) if sums is None else sums).groupby("rank")["window"].sum()


def gpu_overlap(df: pd.DataFrame, sums: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank: the GPU window, compute and comm kernels merged, their intersection, the comm no
    compute kernel ran beside (exposed on the GPU) and the window no compute kernel covered. sums:
    gpu_step_sums(df) where the caller has it (one sweep of the kernels per report, not three)."""
    sums = gpu_step_sums(df) if sums is None else sums
    if not len(sums):
        return defined(pd.DataFrame(columns=GPU_COLUMNS))
    per = sums.drop(columns=["step", "wait"]).groupby("rank", as_index=False).sum()
    window, comp, comm, both = (per[c].to_numpy(dtype=float) for c in ("window", "compute", "comm", "overlapped"))
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(comm > 0, 100 * both / comm, np.nan)
    return defined(pd.DataFrame({"rank": per["rank"].to_numpy(), "gpu_window_ms": window * US_MS,
                                 "kernel_compute_ms": comp * US_MS, "kernel_comm_ms": comm * US_MS,
                                 "kernel_overlapped_ms": both * US_MS, "gpu_exposed_comm_ms": (comm - both) * US_MS,
                                 "compute_idle_ms": (window - comp) * US_MS, "kernel_overlap_pct": pct}))


def stream_busy(df: pd.DataFrame, sums: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank and stream: kernels, comm kernels, busy time (its kernels merged), the comm part of it
    and busy as a % of the rank's GPU window. sums: as gpu_overlap's."""
    window = _windows(df, sums)  # before this view's kernels: one copy of the kernels at a time
    keep = counted_rows(df)   # only the kernels' ts, end, a key and a class byte are taken
    if not keep.any():
        return defined(pd.DataFrame(columns=STREAM_COLUMNS))
    track = df["track"]
    if not isinstance(track.dtype, pd.CategoricalDtype):  # a directory's concat gives objects
        track = track[keep].astype("category")
    tracks = np.append(track.cat.categories.astype(str).to_numpy(), "?")  # code -1 (no track): "?"
    tcode = track.cat.codes.to_numpy()
    tcode = (tcode[keep] if len(tcode) == len(keep) else tcode).astype(np.int64)
    tcode[tcode < 0] = len(tracks) - 1
    rcode, ranks = pd.factorize(df["rank"].to_numpy()[keep])
    code = rcode.astype(np.int64)   # one int per (rank, stream), packed
    del rcode
    code *= len(tracks)
    code += tcode
    del tcode
    comm = (df["kind"] == "comm").to_numpy()[keep].view(np.int8)
    ts, end = df["ts"].to_numpy()[keep], df["end"].to_numpy()[keep]
    del keep
    # one sweep: busy is the union of compute (class 0) and comm (class 1), the comm part class 1 merged
    keys, lengths, _, busy = sweep(code, ts, end, comm, 2)
    del ts, end
    out = pd.DataFrame({"rank": ranks[keys // len(tracks)], "stream": tracks[keys % len(tracks)],
                        "kernels": np.bincount(code)[keys],
                        "comm_kernels": np.bincount(code, weights=comm)[keys].astype(np.int64),
                        "busy_ms": busy * US_MS, "comm_busy_ms": lengths[:, 1] * US_MS})
    window = window.reindex(out["rank"]).to_numpy()
    out["busy_pct"] = np.where(window > 0, 100 * out["busy_ms"] / (window * US_MS), np.nan)
    return defined(out[STREAM_COLUMNS].sort_values(["rank", "stream"]).reset_index(drop=True))
