"""Reading Chrome trace events into the analysis table: partui traces and torch.profiler (Kineto).

Both readers return the same columns (see COLUMNS); `kind` says what an interval is to the overlap
analysis: compute, comm (in flight), wait, step (a step window) or other (ignored).
GPU Kineto traces: NCCL kernels are comm, every other kernel compute (HTA's classes). CPU Kineto
traces (gloo): `gloo:*` record_functions (in flight on gloo's thread) and `c10d::*` calls are comm,
`aten::*` ops compute, `ProfilerStep#N` the step windows.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ["rank", "track", "tid", "name", "cat", "kind", "device", "ts", "dur", "end", "step",
           "mb", "chunk", "layer", "op", "group", "bytes", "peer"]
OP_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "alltoall": "all_to_all", "alltoallbase": "all_to_all", "allgatherbase": "all_gather",
            "reducescatterbase": "reduce_scatter", "sendrecv": "send_recv"}
ARG_KEYS = ["step", "mb", "chunk", "layer", "op", "group", "bytes", "peer"]


class TraceError(ValueError):
    """A file that cannot be analysed; the message names the file and the problem."""


def slices(events: list) -> pd.DataFrame:
    """The complete ('X') events as a frame with their args spread into columns."""
    df = pd.DataFrame.from_records(events, columns=["ph", "name", "cat", "pid", "tid", "ts", "dur",
                                                    "args"])
    df = df[df["ph"] == "X"].reset_index(drop=True)
    args = df["args"].tolist()
    args = [a if isinstance(a, dict) else {} for a in args]  # events without args read as NaN
    wide = pd.DataFrame.from_records(args) if any(args) else pd.DataFrame(index=df.index)
    for key in ARG_KEYS:
        df[key] = wide[key].to_numpy() if key in wide else np.nan
    df["ts"] = pd.to_numeric(df["ts"], errors="coerce")
    df["dur"] = pd.to_numeric(df["dur"], errors="coerce").fillna(0.0)
    df = df[df["ts"].notna()]
    df["end"] = df["ts"] + df["dur"]
    return df.drop(columns=["args", "ph"])


def thread_names(events: list) -> dict:
    return {(e.get("pid"), e.get("tid")): e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "thread_name" and "args" in e}


def track_names(df: pd.DataFrame, events: list) -> pd.Series:
    """Each slice's thread name (a join on (pid, tid), not a lookup per row); else the tid."""
    names = pd.DataFrame([(p, t, n) for (p, t), n in thread_names(events).items()],
                         columns=["pid", "tid", "track"])
    joined = df[["pid", "tid"]].merge(names, on=["pid", "tid"], how="left")["track"]
    return pd.Series(joined.to_numpy(), index=df.index).fillna(df["tid"].astype(str))


def finish(df: pd.DataFrame) -> pd.DataFrame:
    for col in ("step", "mb", "chunk", "layer", "bytes", "peer"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    for col in ("name", "cat", "op", "group", "track"):
        df[col] = df[col].astype("string")
    df["rank"] = df["rank"].astype("int64")
    return df[COLUMNS].sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)


def partui_frame(doc: dict) -> pd.DataFrame:
    events = doc["traceEvents"]
    df = slices(events)
    df["track"] = track_names(df, events)
    df["rank"] = df["pid"]
    on_compute = df["track"].str.startswith("compute")
    cat = df["cat"].astype(str)
    df["kind"] = np.select([cat == "comm", cat == "wait", cat == "step", on_compute],
                           ["comm", "wait", "step", "compute"], "other")
    df["device"] = "cpu"
    return finish(df)


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
    df["kind"] = np.select([comm, compute, step_no.notna()], ["comm", "compute", "step"], "other")
    op = lower.str.extract(r"(?:gloo:|c10d::)([a-z_]+)", expand=False).str.strip("_").fillna(
        lower.str.extract(r"nccl(?:devkernel_|kernel_)?([a-z]+)", expand=False))
    squashed = op.str.replace("_", "", regex=False)
    op = squashed.map(OP_NAMES).fillna(op)  # c10d::allreduce_ and gloo:all_reduce are one op
    df["op"] = df["op"].where(df["op"].notna(), op.where(comm))
    df["group"] = df["group"].where(df["group"].notna(), np.where(comm, "world", None))
    return finish(df)


def detect(doc) -> str:
    """'partui', 'kineto', or raise TraceError naming what is missing."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError("not a Chrome trace (expected a JSON object with a 'traceEvents' list)")
    meta = doc.get("metadata")
    if isinstance(meta, dict) and str(meta.get("format", "")).startswith("partui-trace"):
        return "partui"
    if "schemaVersion" in doc or "distributedInfo" in doc or "deviceProperties" in doc:
        return "kineto"
    raise TraceError("unknown trace format (neither partui's metadata.format nor torch.profiler's "
                     "schemaVersion); record it with `partui run --trace` or torch.profiler")
