"""One reading of a torch.profiler GPU trace as frames: the kernels every view counts and their per-step
figures. Each kernel's launch and step is kineto_kinds' (the one reading of Kineto's events, shared with
the pandas-free reader), every figure gpu_kernels' (computed on arrays); this module builds the frames.
Words: partui.analysis.figures.definitions ("GPU step").

Every view (the main table, --by step, --by op, --by pair, the GPU table and the comm-kernels line)
reads `counted_kernels`, and a step's figures sweep that step's kernels alone, over the step's GPU
window (its kernels' first start to last end); a rank's figures are the sum of its steps'.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.gpu import kineto_kinds
from partui.analysis.gpu.comm_families import family_names
from partui.analysis.gpu.gpu_kernels import Kernels, packed_step_sums, step_key
from partui.analysis.table.sweep import sweep

US_MS = 1e-3
SUMS = ["rank", "step", "window", "compute", "comm", "wait", "overlapped", "union"]
LOOKUP_ROWS = kineto_kinds.LOOKUP_ROWS  # kernels looked up at a time (read at each call: tests shrink it)


def launch_times(df: pd.DataFrame, kernels: pd.DataFrame) -> np.ndarray:
    """Each kernel's launch start (us): the first CPU row of its rank carrying its correlation id; NaN
    where none does (kineto_kinds.launch_times). Step attribution and kineto_pairs' parts both call it."""
    cpu = (df["device"] == "cpu").to_numpy() & df["correlation"].notna().to_numpy()
    return kineto_kinds.launch_times(df["rank"].to_numpy()[cpu], df["correlation"].to_numpy()[cpu],
                                     df["ts"].to_numpy()[cpu], kernels["rank"].to_numpy(),
                                     kernels["correlation"].to_numpy(dtype=float), LOOKUP_ROWS)


def kernel_steps(df: pd.DataFrame) -> np.ndarray:
    """The `step` column with each GPU row's step filled in from its launch (kineto_kinds.kernel_steps);
    CPU rows keep theirs. `df` needs rank, device, kind (step rows marked), ts, end, step, correlation."""
    out = df["step"].to_numpy(dtype=float).copy()
    gpu = (df["device"] == "gpu").to_numpy()
    steps = (df["kind"] == "step").to_numpy() & ~gpu
    if not gpu.any() or not steps.any():
        return out
    rows = np.flatnonzero(gpu)
    rank = df["rank"].to_numpy()[rows]
    kernels = pd.DataFrame({"rank": rank, "correlation": df["correlation"].to_numpy()[rows]}, copy=False)
    t = launch_times(df, kernels)  # what the lookup reads: not every column
    del kernels
    out[rows] = kineto_kinds.kernel_steps(rank, df["ts"].to_numpy()[rows], t, df["rank"].to_numpy()[steps],
                                          df["ts"].to_numpy()[steps], df["end"].to_numpy()[steps],
                                          df["step"].to_numpy(dtype=float)[steps])
    return out


def counted_kernels(df: pd.DataFrame, columns: list | None = None) -> pd.DataFrame:
    """The GPU compute and comm kernels every view counts: of positive length and, where the trace has
    steps, belonging to one. columns: only those of the table (a view that reads a few copies a few:
    a million kernels' every column is ~120 MB)."""
    keep = counted_rows(df)
    return df[keep] if columns is None else df.loc[keep, columns]


def counted_rows(df: pd.DataFrame) -> np.ndarray:
    """Which rows of df counted_kernels keeps, as a mask (a byte a row: a view that reads a column or
    two takes just those, never a frame of the kernels)."""
    kind = df["kind"]
    if isinstance(kind.dtype, pd.CategoricalDtype):  # a few categories tested, not millions of rows
        busy = np.append(kind.cat.categories.isin(["compute", "comm"]), False)[kind.cat.codes.to_numpy()]
    else:
        busy = kind.isin(["compute", "comm"]).to_numpy()
    keep = (df["device"] == "gpu").to_numpy() & busy & (df["end"].to_numpy() > df["ts"].to_numpy())
    if (kind == "step").any():
        keep &= df["step"].notna().to_numpy()
    return keep


KERNEL_FIELDS = ("rank", "step", "comm", "stream", "name", "ts", "end", "dur")


def kernels_of(df: pd.DataFrame, fields=KERNEL_FIELDS) -> Kernels:
    """The counted kernels as gpu_kernels' arrays, only `fields` of them taken (each a column's masked
    copy: a view of a big table holds what it reads, not every field); the comm families are under the
    patterns the trace was loaded with (`df.attrs["comm_kernels"]`)."""
    keep = counted_rows(df)
    out = Kernels()
    for field in fields:
        if field == "comm":
            out.comm = (df["kind"] == "comm").to_numpy()[keep]
        elif field in ("stream", "name"):   # codes as pandas keeps them (a byte or two a kernel), not int64
            col = df["track" if field == "stream" else "name"]
            if not isinstance(col.dtype, pd.CategoricalDtype):  # a directory's concat gives objects
                col = col[keep].astype("category")
            codes = col.cat.codes.to_numpy()
            codes = codes[keep] if len(codes) == len(keep) else codes
            labels = col.cat.categories.tolist()
            if field == "stream":
                out.streams = [str(t) for t in labels] + ["?"]   # code -1 (no track): "?"
                out.stream = np.where(codes < 0, np.int64(len(out.streams) - 1), codes) if (codes < 0).any() else codes
            else:
                out.name, out.names = codes, labels
                out.families = family_names(labels, df.attrs.get("comm_kernels", ()))
        else:
            values = df[field].to_numpy()[keep]
            setattr(out, field, values.astype(np.int64, copy=False) if field == "rank" else values.astype(float, copy=False))
    return out


def gpu_step_sums(df: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step), in us (SUMS): gpu_kernels.step_sums of the counted kernels as a frame."""
    k = kernels_of(df, ("rank", "step", "comm", "ts", "end"))
    if not len(k.rank):
        return pd.DataFrame(columns=SUMS)
    key, span = step_key(k.rank, k.step)
    k.rank = k.step = None   # the key holds them: ~25 bytes a kernel go into the sweep
    return pd.DataFrame(packed_step_sums(key, span, k.ts, k.end, k.comm.view(np.int8)))[SUMS]


def gpu_step_times(df: pd.DataFrame) -> pd.DataFrame:
    """Per step: world_step_ms on the GPU, the first rank's first kernel of the step to the last rank's last
    (a trace without steps: one row, step 0, every counted kernel)."""
    kernels = counted_kernels(df, ["step", "ts", "end"])
    step = kernels["step"].fillna(0).astype(int).to_numpy()
    g = pd.DataFrame({"step": step, "ts": kernels["ts"].to_numpy(), "end": kernels["end"].to_numpy()}).groupby("step")
    spans = g.agg(t0=("ts", "min"), t1=("end", "max"))
    return pd.DataFrame({"step": spans.index.astype(int), "world_step_ms": ((spans["t1"] - spans["t0"]) * US_MS).to_numpy()})


BY_OP = ["op", "group", "ops", "bytes", "comm_ms", "overlapped_ms", "exposed_comm_ms", "overlap_pct"]


def gpu_by_op(df: pd.DataFrame) -> pd.DataFrame:
    """--by op on a GPU trace: per (op, group), its comm kernels merged per (rank, step) and swept
    against that step's compute kernels, summed; `bytes` NaN: a kernel records no bytes."""
    kernels = counted_kernels(df, ["rank", "step", "kind", "ts", "end", "op", "group", "name"])
    comm = kernels[kernels["kind"] == "comm"]
    if not len(comm):
        return pd.DataFrame(columns=BY_OP)
    code, _ = step_key(kernels["rank"].to_numpy(), kernels["step"].to_numpy(dtype=float))  # one id a step
    kernels = kernels.assign(sid=code)
    comm = kernels[kernels["kind"] == "comm"]
    comm = comm.assign(op=comm["op"].astype(object).fillna(comm["name"].astype(object)),
                       group=comm["group"].astype(object).fillna("?"))
    classes = comm[["sid", "op", "group"]].drop_duplicates().reset_index(drop=True)
    classes["cid"] = np.arange(len(classes))
    comm = comm.merge(classes, on=["sid", "op", "group"])
    compute = kernels.loc[kernels["kind"] == "compute", ["sid", "ts", "end"]].merge(classes[["sid", "cid"]], on="sid")
    keys, lengths, inter0, _ = sweep(np.concatenate([comm["cid"].to_numpy(), compute["cid"].to_numpy()]),
                                     np.concatenate([comm["ts"].to_numpy(), compute["ts"].to_numpy()]),
                                     np.concatenate([comm["end"].to_numpy(), compute["end"].to_numpy()]),
                                     np.concatenate([np.ones(len(comm), np.int64), np.zeros(len(compute), np.int64)]), 2)
    classes.loc[keys, "comm"] = lengths[:, 1]
    classes.loc[keys, "overlapped"] = inter0[:, 1]
    classes["ops"] = comm.groupby("cid").size().reindex(classes["cid"]).to_numpy()
    g = classes.groupby(["op", "group"], as_index=False).agg(ops=("ops", "sum"), comm=("comm", "sum"),
                                                             overlapped=("overlapped", "sum"))
    g["bytes"] = np.nan
    g["comm_ms"] = g["comm"] * US_MS
    g["overlapped_ms"] = g["overlapped"] * US_MS
    g["exposed_comm_ms"] = (g["comm"] - g["overlapped"]) * US_MS
    g["overlap_pct"] = np.where(g["comm"] > 0, 100 * g["overlapped"] / g["comm"].where(g["comm"] > 0), np.nan)
    return g[BY_OP].sort_values("exposed_comm_ms", ascending=False).reset_index(drop=True)
