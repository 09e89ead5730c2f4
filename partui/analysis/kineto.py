"""torch.profiler (Kineto) traces into the analysis table.

GPU Kineto traces: kernels (and memcpys) of a comm family (comm_kernels.FAMILIES: NCCL, RCCL, DeepEP,
NVSHMEM, peer-to-peer memcpy, plus the user's --comm-kernels patterns) are comm, every other kernel
compute; memcpy / memset outside a family are neither. CPU Kineto
traces (gloo): `gloo:*` record_functions (in flight on gloo's thread) and `c10d::*` calls are comm,
`aten::*` ops compute, `ProfilerStep#N` the step windows.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.comm_kernels import family_of
from partui.analysis.events import finish, slices, track_names

OP_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "alltoall": "all_to_all", "alltoallbase": "all_to_all", "allgatherbase": "all_gather",
            "reducescatterbase": "reduce_scatter", "sendrecv": "send_recv"}


def is_kineto(doc: dict) -> bool:
    return "schemaVersion" in doc or "distributedInfo" in doc or "deviceProperties" in doc


def kineto_frame(doc: dict, comm_kernels=()) -> pd.DataFrame:
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
    if gpu:  # comm families against all other kernels; CPU ops are not counted
        family = family_of(df["name"], kernel.to_numpy(), comm_kernels)
        comm = pd.Series(pd.notna(family), index=df.index)
        compute = (cat == "kernel") & ~comm
    else:  # gloo: in flight on gloo's thread, issued by c10d calls; aten ops compute
        comm = lower.str.startswith("gloo:") | lower.str.startswith("c10d::") | lower.str.contains(
            "nccl")
        compute = (cat == "cpu_op") & lower.str.startswith("aten::") & ~comm
    df["kind"] = np.select([comm, compute, step_no.notna()], ["comm", "compute", "step"], "other")
    op = lower.str.extract(r"(?:gloo:|c10d::)([a-z_]+)", expand=False).str.strip("_").fillna(
        lower.str.extract(r"nccl(?:devkernel_|kernel_)?([a-z]+)", expand=False))
    short = name.str.extract(r"^(?:void )?([\w:]+)", expand=False)  # a DeepEP kernel: its C++ name
    op = op.fillna(short.where(comm))
    squashed = op.str.replace("_", "", regex=False)
    op = squashed.map(OP_NAMES).fillna(op)  # c10d::allreduce_ and gloo:all_reduce are one op
    given_op, given_group = df["op"].astype(object), df["group"].astype(object)  # categoricals: new labels
    df["op"] = given_op.where(given_op.notna(), op.where(comm))
    df["group"] = given_group.where(given_group.notna(), np.where(comm, "world", None))
    return finish(df)
