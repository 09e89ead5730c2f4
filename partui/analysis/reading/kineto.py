"""torch.profiler (Kineto) traces into the analysis table.

GPU Kineto traces: kernels (and memcpys) of a comm family (comm_kernels.FAMILIES: NCCL, RCCL, DeepEP,
NVSHMEM, peer-to-peer memcpy, plus the user's --comm-kernels patterns) are comm, every other kernel
compute; memcpy / memset outside a family are neither. CPU Kineto
traces (gloo): `gloo:*` record_functions (in flight on gloo's thread) and `c10d::*` calls are comm,
`aten::*` ops compute, `ProfilerStep#N` the step windows; in a `partui run --profile` trace partui's
own ranges (args.partui, partui.recording.profile) are compute, wait and comm in flight as in partui's traces
(gloo's and aten's own ranges are then only shown).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.gpu.comm_families import family_names
from partui.analysis.table.events import finish, slices, thread_names, track_names
from partui.analysis.gpu.gpu_steps import kernel_steps
from partui.analysis.gpu.kineto_kinds import COMM, KINDS, STEP_COPY, event_kinds, gpu_categories, step_numbers
from partui.analysis.reading.partui_format import CONTAINER_CATS, WAIT_CATS

OP_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "alltoall": "all_to_all", "alltoallbase": "all_to_all", "allgatherbase": "all_gather",
            "reducescatterbase": "reduce_scatter", "sendrecv": "send_recv"}


def is_kineto(doc: dict) -> bool:
    return "schemaVersion" in doc or "distributedInfo" in doc or "deviceProperties" in doc


def kineto_frame(doc: dict, comm_kernels=()) -> pd.DataFrame:
    events = doc["traceEvents"]
    return kineto_table(slices(events), thread_names(events), doc, comm_kernels)


def kineto_table(df: pd.DataFrame, names: dict, doc: dict, comm_kernels=()) -> pd.DataFrame:
    """The analysis table of a trace's slices (events.slices), thread names (events.thread_names)
    and its other keys (doc: distributedInfo). df is consumed: its columns move to the table returned."""
    df["track"] = track_names(df, names)
    del df["pid"]  # read by track_names alone: not held through the steps' lookup (8 B a row)
    info = doc.get("distributedInfo") or {}
    df["rank"] = int(info.get("rank", 0))
    # every string test runs once per distinct name or category (a few thousand), then spreads by code
    names = pd.Series(df["name"].cat.categories.astype(str))
    ncode = df["name"].cat.codes.to_numpy()
    cats, ccode = df["cat"].cat.categories.astype(str).str.lower(), df["cat"].cat.codes.to_numpy()
    cat_is = lambda *values: _spread(cats.isin(values), ccode, False)  # noqa: E731  a bool a row, no text
    kernel = _spread(gpu_categories(cats), ccode, False)   # the one reading of Kineto's events: kineto_kinds
    gpu = kernel.any()
    df["device"] = pd.Categorical.from_codes(kernel.astype(np.int8), ["cpu", "gpu"])  # built as codes: no strings
    step = _spread(step_numbers(names.tolist()), ncode, np.nan)
    lower = names.str.lower()
    if gpu:  # comm families against all other kernels; CPU ops are not counted
        comm_name = _spread(np.array([f is not None for f in family_names(names.tolist(), comm_kernels)]), ncode, False)
        kind, step = event_kinds(kernel, cat_is("kernel"), comm_name, step, cat_is(STEP_COPY))
        comm = kind == COMM
        df["step"] = step
        df["kind"] = pd.Categorical.from_codes(kind, KINDS)
    else:  # gloo: in flight on gloo's thread, issued by c10d calls; aten ops compute
        df["step"] = np.where(cat_is(STEP_COPY), np.nan, step)
        by_name = (lower.str.startswith("gloo:") | lower.str.startswith("c10d::") | lower.str.contains("nccl"))
        comm = _spread(by_name.to_numpy(), ncode, False).astype(bool)
        compute = cat_is("cpu_op") & _spread(lower.str.startswith("aten::").to_numpy(), ncode, False).astype(bool) & ~comm
    ours = df["partui"].notna().to_numpy()  # partui run --profile: its own ranges say compute and wait
    if not gpu:
        wait = np.zeros(len(df), dtype=bool)
        if ours.any():
            kind = df["partui"].astype(object)
            comm = ours & (kind == "comm").to_numpy()  # its in-flight ranges: issue to completion, with op and bytes
            wait = ours & kind.isin(WAIT_CATS).to_numpy()
            compute = ours & ~kind.isin(WAIT_CATS + CONTAINER_CATS + ("step", "comm", "issue", "done", "posted")).to_numpy()
        df["kind"] = pd.Categorical.from_codes(
            np.select([comm, wait, compute, ~np.isnan(df["step"].to_numpy())], [0, 1, 2, 3], 4), KINDS)
    if gpu:  # each kernel in the step that launched it (gpu_steps), set once the step rows are marked
        df["step"] = kernel_steps(df)
    if gpu or not ours.any():  # neither a kernel nor a gloo / aten op records a wait or its bytes
        df.attrs["unrecorded"] = ("wait", "bytes")
    op = lower.str.extract(r"(?:gloo:|c10d::)([a-z_]+)", expand=False).str.strip("_").fillna(
        lower.str.extract(r"nccl(?:devkernel_|kernel_)?([a-z]+)", expand=False))
    op = op.fillna(names.str.extract(r"^(?:void )?([\w:]+)", expand=False))  # a DeepEP kernel: its C++ name
    op = op.str.replace("_", "", regex=False).map(OP_NAMES).fillna(op)  # c10d::allreduce_ = gloo:all_reduce
    if df["op"].isna().all() and df["group"].isna().all():  # Kineto's own: no partui args, build as codes
        per_name, labels = pd.factorize(op.to_numpy(dtype=object))   # NaN -> -1
        codes = np.where(comm, np.append(per_name, -1)[ncode], -1)
        df["op"] = pd.Categorical.from_codes(codes, pd.Index(labels, dtype=object))
        df["group"] = pd.Categorical.from_codes(np.where(comm, 0, -1), ["world"])
        return finish(df, consume=True)  # df: this reader's own table of slices
    op = pd.Series(_spread(op.to_numpy(dtype=object), ncode, None), index=df.index)
    given_op, given_group = df["op"].astype(object), df["group"].astype(object)  # categoricals: new labels
    df["op"] = given_op.where(given_op.notna(), op.where(comm))
    df["group"] = given_group.where(given_group.notna(), np.where(comm, "world", None))
    return finish(df, consume=True)


def _spread(per_name: np.ndarray, codes: np.ndarray, missing):
    """A per-category value for each row (code -1, a missing name: `missing`)."""
    return np.append(per_name, np.array([missing], dtype=per_name.dtype if missing is not None else object))[codes]
