"""Overlap, exposed comm, idle and bubble from a trace, with HTA's definitions (docs/architecture.md).

    from partui.analysis import load, overlap
    df = load("traces/run.json")          # one row per slice; partui or torch.profiler traces
    overlap(df, by="rank")                # or "step", "op"

Per window (a rank's whole run, or one step of one rank), compute intervals and comm in-flight
intervals are each merged, then swept together: a single sorted pass over +1/-1 boundaries gives
the merged lengths, their intersection and their union, with no Python loop per event.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.figures.cpu import core_sharing
from partui.analysis.figures.definitions import defined
from partui.analysis.table.events import TraceError
from partui.analysis.gpu.gpu_kernels import (hta_classes, hta_overlap_pct, launched_by,  # noqa: F401
                                             rank_sums, report_figures)
from partui.analysis.gpu.gpu_steps import SUMS, gpu_by_op, gpu_step_sums, gpu_step_times
from partui.analysis.gpu.hta_filter import hta_rows
from partui.analysis.figures.pipeline import simulated_steps, theoretical_bubble
from partui.analysis.table.sweep import clip_index, sweep, sweep_windows, windows_of
from partui.analysis.figures.timing import actions, pipeline_windows

US_MS = 1e-3


def overlap(df: pd.DataFrame, by: str = "rank", gpu_sums: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank, per (rank, step), or per (op, group): times in ms and percentages; what each
    column counts (partui.analysis.figures.definitions) is in `.attrs["definitions"]`. Only step windows are
    measured: time between steps (the controller, a user deciding) enters no figure. gpu_sums: see
    overlap_views."""
    return overlap_views(df, (by,), gpu_sums)[by]


def overlap_views(df: pd.DataFrame, views=("rank", "step", "op"), gpu_sums: pd.DataFrame | None = None) -> dict:
    """{view: overlap(df, view)} for several views of one trace, the per-window sweep, core sharing
    and the pipeline simulations computed once for all of them. gpu_sums: gpu_step_sums(df) where the
    caller has it (a report's GPU tables read it too), else computed here."""
    bad = [v for v in views if v not in ("rank", "step", "op")]
    if bad:
        raise ValueError(f"by must be rank, step or op, not {bad[0]!r}")
    if "step" in views and not bool((df["kind"] == "step").any()):
        raise TraceError("no step spans in this trace (name 'step', cat 'step'); use --by rank")
    shared = _per_window(df, gpu_sums) if set(views) & {"rank", "step"} else None
    gpu = bool((df["device"] == "gpu").any())
    out = {}
    for by in views:
        out[by] = defined(_overlap_by_op(df) if by == "op" else _overlap(df, by, *shared, gpu=gpu))
    return out


def _per_window(df: pd.DataFrame, gpu_sums: pd.DataFrame | None = None):
    """(per-window sums in us, the pipeline simulations or None): what rank and step views share."""
    if (df["device"] == "gpu").any():   # kernels in the step that launched them, over its GPU window
        return (gpu_step_sums(df) if gpu_sums is None else gpu_sums), None
    windows = windows_of(df, by_step=bool((df["kind"] == "step").any()))
    acts = actions(df)   # once: the pipeline windows and the simulations' costs read it
    pipe = pipeline_windows(df, windows, acts)
    z = sweep_windows(df, windows, pipe)  # the pipeline windows' compute from the same sweep
    res = pd.DataFrame({"rank": windows["rank"].to_numpy(), "step": windows["step"].to_numpy(),
                        "window": (windows["w1"] - windows["w0"]).to_numpy()})
    for col in ("compute", "comm", "wait", "overlapped", "union"):
        res[col] = z[col].to_numpy()
    if "wait" in df.attrs.get("unrecorded", ()):   # a torch.profiler CPU trace: no op records a wait
        res["wait"] = np.nan
    cores = core_sharing(df, windows)
    if cores is not None:
        res["cpu"], res["no_core"] = cores["cpu"].to_numpy(), cores["no_core"].to_numpy()
    sims = None
    if pipe is not None:
        res["pipe"] = np.nan
        res.loc[pipe["wid"].to_numpy(), "pipe"] = (pipe["w1"] - pipe["w0"]).to_numpy()
        res["pipe_compute"] = z["inner_compute"].to_numpy()
        sims = simulated_steps(df, windows, pipe, acts)
    return res, sims


def _overlap(df: pd.DataFrame, by: str, res: pd.DataFrame, sims, gpu: bool = False) -> pd.DataFrame:
    if by == "rank" and gpu:   # a GPU trace's step sums (gpu_steps): gpu_kernels adds them up
        res = pd.DataFrame(rank_sums({c: res[c].to_numpy() for c in SUMS}))
    elif by == "rank":
        res = res.drop(columns="step").groupby("rank", as_index=False).sum(min_count=1)
    out = _figures(res, by)
    if sims is not None:      # the schedule's, under this trace's own timing and ideally
        theory = theoretical_bubble(df, out[["rank"] + (["step"] if by == "step" else [])], sims)
        out["sim_bubble_pct"], out["sim_ideal_bubble_pct"], out["formula_bubble_pct"] = theory
    return out


def _figures(z: pd.DataFrame, by: str) -> pd.DataFrame:
    """Summed us per window or rank -> the report's ms and % columns."""
    res = z[["rank"] + (["step"] if by == "step" else [])].copy()
    if by == "step":
        res["step"] = res["step"].astype("Int64")  # step 1, not 1.0
    figures = report_figures(*(z[c].to_numpy(dtype=float) for c in ("window", "compute", "comm", "overlapped",
                                                                      "wait", "union")))
    for col, values in figures.items():
        res[col] = values
    window = z["window"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        if "cpu" in z:
            res["cpu_ms"] = z["cpu"].to_numpy() * US_MS
            res["no_core_ms"] = z["no_core"].to_numpy() * US_MS
        if "pipe" in z:
            pipe = z["pipe"].to_numpy(dtype=float)
            res["pipe_ms"] = pipe * US_MS
            res["pipe_bubble_pct"] = np.where(pipe > 0, 100 * (1 - z["pipe_compute"].to_numpy() / pipe),
                                              np.nan)
            res["rest_ms"] = (window - np.nan_to_num(pipe)) * US_MS   # loss / mirror / grad sync, optimizer
    return res.reset_index(drop=True)


def _overlap_by_op(df: pd.DataFrame) -> pd.DataFrame:
    """Exposed comm per (op, group), summed over ranks. Ops of one class are merged; different
    ops in flight at once each count their own time, so rows can add up to more than the total."""
    if (df["device"] == "gpu").any():
        return gpu_by_op(df)
    windows = windows_of(df, by_step=bool((df["kind"] == "step").any()))  # nothing between steps
    cols = ["op", "group", "ops", "bytes", "comm_ms", "overlapped_ms", "exposed_comm_ms",
            "overlap_pct"]
    kind, rank = df["kind"], df["rank"].to_numpy()
    ts, end = df["ts"].to_numpy(), df["end"].to_numpy()
    at = np.flatnonzero((kind == "comm").to_numpy())
    rows, _, c_ts, c_end = clip_index(rank[at], ts[at], end[at], windows)
    if not len(rows):
        return pd.DataFrame(columns=cols)
    at = at[rows]
    cid, classes = comm_classes(df, at)
    # each (rank, op, group) class is swept against its rank's compute (and waits, which are not
    # compute), so those are repeated once per class of its rank (a handful), never per event pair
    busy = np.flatnonzero(kind.isin(["compute", "wait"]).to_numpy())
    rows, _, b_ts, b_end = clip_index(rank[busy], ts[busy], end[busy], windows)
    busy = busy[rows]
    by_rank = classes.sort_values("rank", kind="stable")
    c_rank, c_cid = by_rank["rank"].to_numpy(), by_rank["cid"].to_numpy()
    lo = np.searchsorted(c_rank, rank[busy], side="left")
    n = np.searchsorted(c_rank, rank[busy], side="right") - lo     # classes of each piece's rank
    rep = np.repeat(np.arange(len(busy)), n)
    rep_cid = c_cid[np.repeat(lo, n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))]
    key = np.concatenate([cid, rep_cid])
    ts = np.concatenate([c_ts, b_ts[rep]])
    end = np.concatenate([c_end, b_end[rep]])
    cls = np.concatenate([np.ones(len(cid), dtype=np.int64),
                          np.where((kind == "wait").to_numpy()[busy[rep]], 2, 0)])
    keys, lengths, inter0, _ = sweep(key, ts, end, cls, 3)
    classes.loc[keys, "comm"] = lengths[:, 1]
    classes.loc[keys, "overlapped"] = inter0[:, 1]
    counts = pd.DataFrame({"ops": np.bincount(cid, minlength=len(classes))}, index=pd.Index(np.arange(len(classes)), name="cid"))
    counts["bytes"] = pd.Series(df["bytes"].to_numpy()[at]).groupby(cid).sum(min_count=1)   # none recorded: NaN, never 0
    classes = classes.join(counts, on="cid")
    g = classes.groupby(["op", "group"], as_index=False).agg(
        ops=("ops", "sum"), comm=("comm", "sum"), overlapped=("overlapped", "sum"))
    g["bytes"] = classes.groupby(["op", "group"])["bytes"].sum(min_count=1).to_numpy()
    g["comm_ms"] = g["comm"] * 1e-3
    g["overlapped_ms"] = g["overlapped"] * 1e-3
    g["exposed_comm_ms"] = (g["comm"] - g["overlapped"]) * 1e-3
    g["overlap_pct"] = np.where(g["comm"] > 0, 100 * g["overlapped"] / g["comm"].where(g["comm"] > 0),
                                np.nan)
    return g[cols].sort_values("exposed_comm_ms", ascending=False).reset_index(drop=True)


def comm_classes(df: pd.DataFrame, at: np.ndarray) -> tuple[np.ndarray, pd.DataFrame]:
    """The (rank, op, group) class of each comm row df.iloc[at] (op: its name where no op is
    recorded; group "?" where none): (each row's cid, classes [rank, op, group, cid] in the order
    they first appear). Labels are compared as codes; each distinct combination is spelt once."""
    codes = [pd.factorize(df["rank"].to_numpy()[at])[0]]
    for col in ("op", "name", "group"):
        v = df[col].iloc[at]
        codes.append(v.cat.codes.to_numpy() if isinstance(v.dtype, pd.CategoricalDtype) else pd.factorize(v)[0])
    codes[2] = np.where(codes[1] >= 0, -1, codes[2])  # a name counts only where the op is missing
    combined = np.zeros(len(at), dtype=np.int64)
    for c in codes:
        combined = combined * (int(c.max(initial=0)) + 2) + (c + 1)
    _, first = np.unique(combined, return_index=True)
    first = np.sort(first)                       # combinations in order of first appearance
    raw_id = pd.factorize(combined)[0]           # numbered in that same order
    spelt = df.iloc[at[first]][["rank", "op", "group", "name"]]
    if spelt["op"].isna().any():  # as text: categoricals of other categories do not fill each other
        spelt = spelt.assign(op=spelt["op"].astype(object).where(spelt["op"].notna(), spelt["name"].astype(object)))
    if spelt["group"].isna().any():
        spelt = spelt.assign(group=spelt["group"].astype(object).where(spelt["group"].notna(), "?"))
    spelt = spelt[["rank", "op", "group"]].reset_index(drop=True)
    same = spelt.groupby(["rank", "op", "group"], sort=False, observed=True, dropna=False).ngroup().to_numpy()
    classes = spelt.drop_duplicates().reset_index(drop=True)
    classes["cid"] = np.arange(len(classes))
    return same[raw_id], classes


# ---------------------------------------------------------------- theory, step times, HTA


def oversubscription_note(df: pd.DataFrame) -> str | None:
    """A line for reports of a trace whose ranks outnumbered the cores they shared, else None."""
    meta = df.attrs.get("metadata") or {}
    cpus, ranks = meta.get("cpus"), df["rank"].nunique() if len(df) else 0
    if not cpus or ranks <= cpus:
        return None
    return (f"note: {ranks} ranks shared {cpus} CPU cores and took turns on them, so spans stretch and the "
            f"measured bubble includes time a rank was ready but had no core"
            + ("; sim_ideal_bubble_pct is the schedule's own under the mean F/B/W times, "
               "sim_bubble_pct its replay under the trace's own timing"
               if int((meta.get("plan") or {}).get("pp") or 1) > 1 else ""))


def step_times(df: pd.DataFrame) -> pd.DataFrame:
    """Per step: world_step_ms, the wall time from the first rank's start to the last rank's end."""
    if (df["device"] == "gpu").any():   # its kernels, by the step that launched them
        return defined(gpu_step_times(df))
    steps = df[df["kind"] == "step"]
    if not len(steps):
        w = windows_of(df, by_step=False)
        return defined(pd.DataFrame({"step": [0], "world_step_ms": [(w["w1"].max() - w["w0"].min()) * 1e-3]}))
    g = steps.groupby("step").agg(t0=("ts", "min"), t1=("end", "max"))
    return defined(pd.DataFrame({"step": g.index.astype(int),
                                 "world_step_ms": ((g["t1"] - g["t0"]) * 1e-3).to_numpy()}))


def hta_overlap(df: pd.DataFrame, include_last_profiler_step: bool = False) -> pd.DataFrame:
    """HTA's comm-comp overlap % per rank, under HTA's rule (definitions: comm_comp_overlap_pct):
    GPU events (kernels, memcpys, memsets) only; a name matching ^nccl.*Kernel is comm, a name holding
    Memcpy or Memset neither, every other kernel compute; each class merged. Times are first rounded
    inward to whole us as HTA's JSON parser does (start up, end down; a kernel shorter than that
    vanishes). HTA's filter first (Trace.load_traces): with two or more ProfilerStep#N, only kernels
    launched (by correlation id) from CPU events that start before the last step begins count;
    include_last_profiler_step=True keeps those starting up to the last step's end. On CPU traces
    there are no kernels and, as with HTA, the figure is NaN. The comm families of the other figures
    (comm_kernels.py) do not enter: this is HTA's number, for comparison with HTA."""
    ranks = sorted(df["rank"].unique())
    rows = hta_rows(df, include_last_profiler_step)  # a mask: only the columns read are taken, row by kept row
    name = df["name"]
    if not isinstance(name.dtype, pd.CategoricalDtype):  # a directory's concat gives objects
        name = name[rows].astype("category")
    codes = name.cat.codes.to_numpy()
    cls = hta_classes(name.cat.categories.tolist())[codes[rows] if len(codes) == len(rows) else codes]
    del codes    # each distinct name classed once
    pct = hta_overlap_pct(ranks, df["rank"].to_numpy()[rows], cls, df["ts"].to_numpy(dtype=float)[rows],
                          df["end"].to_numpy(dtype=float)[rows], owned=True)
    return defined(pd.DataFrame({"rank": ranks, "comm_comp_overlap_pct": pct}))


def hta_kernels(df: pd.DataFrame, include_last_profiler_step: bool = False) -> pd.DataFrame:
    """The GPU events HTA keeps (see hta_overlap): their rank, name, ts and end only (all hta_overlap
    reads), so a trace of millions of kernels is not copied whole."""
    return df.loc[hta_rows(df, include_last_profiler_step), ["rank", "name", "ts", "end"]]
