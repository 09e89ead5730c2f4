"""One reading of a torch.profiler GPU trace: each kernel's launch, the step it belongs to, the kernels
every view counts, and their per-step figures. Words: partui.analysis.definitions ("GPU step").

A kernel's launch is the CPU-side call that carries its correlation id (the link Kineto's `ac2g` flows
draw), whatever the API: runtime and driver launches (cudaLaunchKernel, cudaLaunchKernelExC,
cuLaunchKernel), graph launches (cudaGraphLaunch), ROCm's hipLaunchKernel / hipModuleLaunchKernel, and
the memcpy calls that start a peer copy. A kernel belongs to the step whose ProfilerStep#N window holds
its launch's start, never to the CPU window it happens to run in: a GPU that runs most of a step behind
its CPU still has each step's kernels in that step. A kernel no CPU call claims belongs to the last step
of its rank that began before it started (it cannot run before its launch); a kernel launched outside
every step belongs to none and, where the trace has steps, no figure counts it (as time between steps).

Every view (the main table, --by step, --by op, --by pair, the GPU table and the comm-kernels line)
reads `counted_kernels` (or its mask, `counted_rows`), and a step's figures sweep that step's kernels
alone, over the step's GPU window (its kernels' first start to last end); a rank's figures are the
sum of its steps'.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.sweep import sweep

US_MS = 1e-3
SUMS = ["rank", "step", "window", "compute", "comm", "wait", "overlapped", "union"]


def launch_times(df: pd.DataFrame, kernels: pd.DataFrame) -> np.ndarray:
    """Each kernel's launch start (us): the first CPU row of its rank carrying its correlation id; NaN
    where none does. The one launch lookup: step attribution and kineto_pairs' parts both call it.
    Binary search per rank over the calls' sorted ids (no per-kernel hashing of index tuples)."""
    cpu = (df["device"] == "cpu").to_numpy() & df["correlation"].notna().to_numpy()
    calls = {col: df[col].to_numpy()[cpu] for col in ("rank", "correlation", "ts")}
    del cpu
    k_rank, k_corr = kernels["rank"].to_numpy(), kernels["correlation"].to_numpy(dtype=float)
    out = np.full(len(kernels), np.nan)
    c_rank = calls.pop("rank")
    one_rank = bool(len(k_rank) and len(c_rank) and k_rank.min() == k_rank.max() == c_rank.min() == c_rank.max())
    for r in np.unique(k_rank):
        if one_rank:  # a torch.profiler file: its calls taken over, no masked copies
            ids, launched = _first_calls(calls.pop("correlation"), calls.pop("ts"))
        else:
            mine = c_rank == r
            ids, launched = _first_calls(calls["correlation"][mine], calls["ts"][mine])
        if not len(ids):
            continue
        at = None if one_rank else np.flatnonzero(k_rank == r)
        for lo in range(0, len(k_rank) if one_rank else len(at), LOOKUP_ROWS):  # bounded temporaries
            rows = slice(lo, lo + LOOKUP_ROWS) if one_rank else at[lo:lo + LOOKUP_ROWS]
            wanted = k_corr[rows]
            k = np.searchsorted(ids, wanted)
            np.minimum(k, len(ids) - 1, out=k)
            hit = ids[k] == wanted
            if one_rank:
                out[rows][hit] = launched[k[hit]]  # a slice of out: a view, written in place
            else:
                out[rows[hit]] = launched[k[hit]]
    return out


LOOKUP_ROWS = 1 << 20  # kernels looked up at a time: a few arrays this long, whatever the trace's size


def _first_calls(corr: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct correlation ids in order, and each one's earliest call time."""
    order = np.lexsort((ts, corr))  # by id, the earliest call of an id first
    corr, ts = corr[order], ts[order]
    del order
    first = np.flatnonzero(np.append(True, corr[1:] != corr[:-1]))
    return corr[first], ts[first]


def kernel_steps(df: pd.DataFrame) -> np.ndarray:
    """The `step` column with each GPU row's step filled in from its launch (see the module's words);
    CPU rows keep theirs. `df` needs rank, device, kind (step rows marked), ts, step, correlation."""
    out = df["step"].to_numpy(dtype=float).copy()
    gpu = (df["device"] == "gpu").to_numpy()
    steps = df[(df["kind"] == "step").to_numpy() & ~gpu]
    if not gpu.any() or not len(steps):
        return out
    rows = np.flatnonzero(gpu)
    rank = df["rank"].to_numpy()[rows]
    kernels = pd.DataFrame({"rank": rank, "correlation": df["correlation"].to_numpy()[rows]}, copy=False)
    t = launch_times(df, kernels)  # what the lookup reads: not every column
    del kernels
    claimed = ~np.isnan(t)
    t[~claimed] = df["ts"].to_numpy()[rows][~claimed]  # an unclaimed kernel: by its own start
    one_rank = len(rank) and rank.min() == rank.max()
    for r, w in steps.groupby("rank"):
        w = w.sort_values("ts")
        w0, w1, number = w["ts"].to_numpy(), w["end"].to_numpy(), w["step"].to_numpy()
        mine = slice(None) if one_rank and r == rank[0] else rank == r  # one rank: no masked copies
        k = np.searchsorted(w0, t[mine], side="right")
        k -= 1
        ok = k >= 0
        np.maximum(k, 0, out=k)
        ok &= ~claimed[mine] | (t[mine] <= w1[k])   # an orphan: the last step begun before it ran
        got = number[k].astype(float)
        got[~ok] = np.nan
        out[rows[mine]] = got
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


def _step_keys(kernels: pd.DataFrame) -> tuple[np.ndarray, list]:
    """One integer key per (rank, step) ("step" -1: a trace without steps, each rank one window), and the
    (rank, step) of each key."""
    rank = kernels["rank"].to_numpy().astype(np.int64)
    step = np.nan_to_num(kernels["step"].to_numpy(dtype=float), nan=-1).astype(np.int64)
    span = int(step.max()) + 2 if len(step) else 1
    code, uniq = pd.factorize(rank * span + step + 1)       # one int64 per pair: fast to hash
    return code, [(int(u // span), int(u % span) - 1) for u in uniq]


def gpu_step_sums(df: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step), in us (SUMS): the step's GPU window, its compute kernels merged, its comm
    kernels merged, their intersection and union; `wait` NaN: a GPU trace records no waits. Only the
    kernels' ts, end, a key and a class byte are taken (~25 bytes a kernel; the sweep runs a chunk of
    keys at a time), so millions of kernels add little to the loaded table."""
    keep = counted_rows(df)
    if not keep.any():
        return pd.DataFrame(columns=SUMS)
    code = df["step"].to_numpy(dtype=float)[keep]   # (rank, step + 1) packed in one int64, built in place
    np.nan_to_num(code, copy=False, nan=-1.0)   # -1: a trace without steps, each rank one window
    code += 1
    span = int(code.max()) + 1
    code = code.astype(np.int64)
    rank = df["rank"].to_numpy()[keep].astype(np.int64, copy=False)
    rank *= span
    code += rank
    del rank
    cls = (df["kind"] == "comm").to_numpy()[keep].view(np.int8)
    ts, end = df["ts"].to_numpy()[keep], df["end"].to_numpy()[keep]
    del keep
    keys, lengths, inter0, union = sweep(code, ts, end, cls, 2)
    w0, w1 = np.full(len(keys), np.inf), np.full(len(keys), -np.inf)
    for lo in range(0, len(code), LOOKUP_ROWS):   # each step's first start and last end
        at = np.searchsorted(keys, code[lo:lo + LOOKUP_ROWS])
        np.minimum.at(w0, at, ts[lo:lo + LOOKUP_ROWS])
        np.maximum.at(w1, at, end[lo:lo + LOOKUP_ROWS])
    step = (keys % span - 1).astype(float)
    out = pd.DataFrame({"rank": keys // span, "step": np.where(step < 0, np.nan, step),
                        "window": w1 - w0, "compute": lengths[:, 0], "comm": lengths[:, 1], "wait": np.nan,
                        "overlapped": inter0[:, 1], "union": union})
    return out.sort_values(["rank", "step"]).reset_index(drop=True)


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
    code, _ = _step_keys(kernels)
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
