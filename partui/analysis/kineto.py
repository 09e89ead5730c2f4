"""torch.profiler (Kineto) traces into the analysis table.

GPU Kineto traces: NCCL kernels are comm, every other kernel compute (HTA's classes). CPU Kineto
traces (gloo): `gloo:*` record_functions (in flight on gloo's thread) and `c10d::*` calls are comm,
`aten::*` ops compute, `ProfilerStep#N` the step windows; in a `partui run --profile` trace partui's
own ranges (args.partui, partui.profile) are compute, wait and comm in flight as in partui's traces
(gloo's and aten's own ranges are then only shown).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.events import finish, slices, track_names
from partui.analysis.partui_format import CONTAINER_CATS, WAIT_CATS

OP_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "alltoall": "all_to_all", "alltoallbase": "all_to_all", "allgatherbase": "all_gather",
            "reducescatterbase": "reduce_scatter", "sendrecv": "send_recv"}


def is_kineto(doc: dict) -> bool:
    return "schemaVersion" in doc or "distributedInfo" in doc or "deviceProperties" in doc


def kineto_frame(doc: dict) -> pd.DataFrame:
    events = doc["traceEvents"]
    df = slices(events)
    df["track"] = track_names(df, events)
    info = doc.get("distributedInfo") or {}
    df["rank"] = int(info.get("rank", 0))
    name = df["name"].astype(str)
    lower = name.str.lower()
    cat = df["cat"].astype(str).str.lower()
    kernel = cat.isin(["kernel", "gpu_memcpy", "gpu_memset"])
    gpu = kernel.any()
    df["device"] = np.where(kernel, "gpu", "cpu")
    step_no = name.str.extract(r"^ProfilerStep#(\d+)$", expand=False)
    df["step"] = pd.to_numeric(step_no, errors="coerce")
    if gpu:  # HTA's classes: NCCL kernels against all other kernels; CPU ops are not counted
        comm = kernel & lower.str.contains("nccl")
        compute = (cat == "kernel") & ~comm
    else:  # gloo: in flight on gloo's thread, issued by c10d calls; aten ops compute
        comm = lower.str.startswith("gloo:") | lower.str.startswith("c10d::") | lower.str.contains(
            "nccl")
        compute = (cat == "cpu_op") & lower.str.startswith("aten::") & ~comm
    wait = pd.Series(False, index=df.index)
    ours = df["partui"].notna()  # partui run --profile: its own ranges say compute and wait
    if not gpu and ours.any():
        kind = df["partui"].astype(str)
        comm = ours & (kind == "comm")  # its in-flight ranges: issue to completion, with op and bytes
        wait = ours & kind.isin(WAIT_CATS)
        compute = ours & ~kind.isin(WAIT_CATS + CONTAINER_CATS + ("step", "comm", "issue", "done", "posted"))
    df["kind"] = np.select([comm, wait, compute, step_no.notna()], ["comm", "wait", "compute", "step"],
                           "other")
    op = lower.str.extract(r"(?:gloo:|c10d::)([a-z_]+)", expand=False).str.strip("_").fillna(
        lower.str.extract(r"nccl(?:devkernel_|kernel_)?([a-z]+)", expand=False))
    squashed = op.str.replace("_", "", regex=False)
    op = squashed.map(OP_NAMES).fillna(op)  # c10d::allreduce_ and gloo:all_reduce are one op
    given_op, given_group = df["op"].astype(object), df["group"].astype(object)  # categoricals: new labels
    df["op"] = given_op.where(given_op.notna(), op.where(comm))
    df["group"] = given_group.where(given_group.notna(), np.where(comm, "world", None))
    return finish(df)
