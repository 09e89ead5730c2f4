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
from partui.analysis.gpu_steps import counted_kernels, gpu_step_sums
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
    gpu = counted_kernels(df, ["rank", "track", "kind", "ts", "end"])
    if not len(gpu):
        return defined(pd.DataFrame(columns=STREAM_COLUMNS))
    track = gpu["track"].astype("category")  # a no-op on one file; a directory's concat gives objects
    tracks = np.append(track.cat.categories.astype(str).to_numpy(), "?")  # code -1 (no track): "?"
    rcode, ranks = pd.factorize(gpu["rank"].to_numpy())
    tcode = np.where(track.cat.codes.to_numpy() < 0, len(tracks) - 1, track.cat.codes.to_numpy())
    code, pairs = pd.factorize(rcode.astype(np.int64) * len(tracks) + tcode)  # one int per (rank, stream)
    uniq = [(ranks[p // len(tracks)], tracks[p % len(tracks)]) for p in pairs]
    comm = (gpu["kind"] == "comm").to_numpy()
    keys, busy, _, _ = sweep(code, gpu["ts"].to_numpy(), gpu["end"].to_numpy(), np.zeros(len(gpu), np.int64), 1)
    ck, cbusy, _, _ = sweep(code[comm], gpu["ts"].to_numpy()[comm], gpu["end"].to_numpy()[comm],
                            np.zeros(int(comm.sum()), np.int64), 1)
    out = pd.DataFrame({"rank": [uniq[k][0] for k in keys], "stream": [uniq[k][1] for k in keys],
                        "kernels": np.bincount(code, minlength=len(uniq))[keys],
                        "comm_kernels": np.bincount(code[comm], minlength=len(uniq))[keys],
                        "busy_ms": busy[:, 0] * US_MS})
    out["comm_busy_ms"] = pd.Series(cbusy[:, 0] * US_MS, index=ck).reindex(keys, fill_value=0.0).to_numpy()
    window = window.reindex(out["rank"]).to_numpy()
    out["busy_pct"] = np.where(window > 0, 100 * out["busy_ms"] / (window * US_MS), np.nan)
    return defined(out[STREAM_COLUMNS].sort_values(["rank", "stream"]).reset_index(drop=True))
