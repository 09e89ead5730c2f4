"""Overlap, exposed comm, idle and bubble from a trace, with HTA's definitions (docs/architecture.md).

    from partui.analysis import load, overlap
    df = load("traces/run.json")          # one row per slice; partui or torch.profiler traces
    overlap(df, by="rank")                # or "step", "op"

Per window (a rank's whole run, or one step of one rank), compute intervals and comm in-flight
intervals are each merged, then swept together: a single sorted pass over +1/-1 boundaries gives
the merged lengths, their intersection and their union, with no Python loop per event.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from kernels.pp.schedules import build_schedule
from kernels.pp.simulate import Cost, formula_bubble, simulate
from partui.analysis.definitions import DEFINITIONS
from partui.analysis.events import TraceError


# ---------------------------------------------------------------- windows and the sweep

def _windows(df: pd.DataFrame, by_step: bool) -> pd.DataFrame:
    """[wid, rank, step, w0, w1]: step spans when there are any, else each rank's extent."""
    steps = df[df["kind"] == "step"]
    if len(steps):
        w = steps.groupby(["rank", "step"], as_index=False).agg(w0=("ts", "min"), w1=("end", "max"))
        if not by_step:
            w = w.groupby("rank", as_index=False).agg(w0=("w0", "min"), w1=("w1", "max"))
            w["step"] = np.nan
    else:
        if by_step:
            raise TraceError("no step spans in this trace (name 'step', cat 'step'); use --by rank")
        busy = df[df["kind"].isin(["compute", "comm", "wait"])]
        w = busy.groupby("rank", as_index=False).agg(w0=("ts", "min"), w1=("end", "max"))
        w["step"] = np.nan
    w = w.sort_values(["rank", "w0"]).reset_index(drop=True)
    w["wid"] = np.arange(len(w))
    return w[["wid", "rank", "step", "w0", "w1"]]


def _clip(iv: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Cut intervals [ts, end] to the windows of their rank; one row per (interval, window) piece."""
    parts = []
    for rank, w in windows.groupby("rank"):  # a loop per rank, vectorized inside
        x = iv[iv["rank"] == rank]
        if not len(x):
            continue
        w0, w1 = w["w0"].to_numpy(), w["w1"].to_numpy()
        first = np.searchsorted(w1, x["ts"].to_numpy(), side="right")  # windows sorted, disjoint
        last = np.searchsorted(w0, x["end"].to_numpy(), side="left") - 1
        n = np.clip(last - first + 1, 0, None)
        rows = np.repeat(np.arange(len(x)), n)
        k = np.repeat(first, n) + (np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n))
        piece = x.iloc[rows].copy()
        piece["ts"] = np.maximum(piece["ts"].to_numpy(), w0[k])
        piece["end"] = np.minimum(piece["end"].to_numpy(), w1[k])
        piece["wid"] = w["wid"].to_numpy()[k]
        parts.append(piece[piece["end"] > piece["ts"]])
    return pd.concat(parts) if parts else iv.iloc[:0].assign(wid=0)


def _sweep(key: np.ndarray, ts: np.ndarray, end: np.ndarray, cls: np.ndarray, n_cls: int):
    """Per key: merged length of each class, of each class's intersection with class 0, and of
    the union of classes 0 and 1 (compute and comm). With a third class (waits), class 0 counts
    only while no wait is open: a blocking op inside an "F+B" span is exposed, not overlapped. Returns (keys, lengths[key, cls], inter0[key, cls], union[key])."""
    m = len(ts)
    t = np.concatenate([ts, end])
    k = np.concatenate([key, key])
    delta = np.zeros((2 * m, n_cls), dtype=np.int64)
    delta[np.arange(m), cls] = 1
    delta[m + np.arange(m), cls] = -1
    order = np.lexsort((t, k))
    t, k, delta = t[order], k[order], delta[order]
    depth = np.cumsum(delta, axis=0)  # each interval adds +1 then -1, so depth is 0 between keys
    seg = np.diff(t, append=t[-1:] if len(t) else t)
    seg = np.where(np.r_[k[1:] == k[:-1], False], seg, 0.0)  # no segment across keys
    on = depth > 0
    if n_cls > 2:  # a rank blocked in a wait is not computing, even inside a compute span
        on[:, 0] &= ~on[:, 2]
    keys, idx = np.unique(k, return_inverse=True)
    lengths = np.zeros((len(keys), n_cls))
    inter0 = np.zeros((len(keys), n_cls))
    np.add.at(lengths, idx, on * seg[:, None])
    np.add.at(inter0, idx, (on & on[:, :1]) * seg[:, None])
    union = np.bincount(idx, weights=on[:, :2].any(axis=1) * seg, minlength=len(keys))
    return keys, lengths, inter0, union


_CLASSES = {"compute": 0, "comm": 1, "wait": 2}


def overlap(df: pd.DataFrame, by: str = "rank") -> pd.DataFrame:
    """Per rank, per (rank, step), or per (op, group): times in ms and percentages; what each
    column counts is in `.attrs["definitions"]`."""
    out = _overlap(df, by)
    out.attrs["definitions"] = {c: DEFINITIONS[c] for c in out.columns if c in DEFINITIONS}
    return out


def _overlap(df: pd.DataFrame, by: str) -> pd.DataFrame:
    if by not in ("rank", "step", "op"):
        raise ValueError(f"by must be rank, step or op, not {by!r}")
    if by == "op":
        return _overlap_by_op(df)
    windows = _windows(df, by_step=(by == "step"))
    iv = _clip(df[df["kind"].isin(list(_CLASSES))], windows)
    cls = iv["kind"].map(_CLASSES).to_numpy()
    keys, lengths, inter0, union = _sweep(iv["wid"].to_numpy(), iv["ts"].to_numpy(),
                                          iv["end"].to_numpy(), cls, len(_CLASSES))
    out = windows.set_index("wid")
    z = pd.DataFrame(0.0, index=out.index, columns=["compute", "comm", "wait", "overlapped", "union"])
    z.loc[keys, ["compute", "comm", "wait"]] = lengths
    z.loc[keys, "overlapped"] = inter0[:, 1]
    z.loc[keys, "union"] = union
    res = pd.DataFrame({"rank": out["rank"], "step": out["step"]})
    us_ms = 1e-3
    window = (out["w1"] - out["w0"]).to_numpy()
    res["window_ms"] = window * us_ms
    res["compute_ms"] = z["compute"] * us_ms
    res["comm_ms"] = z["comm"] * us_ms
    res["overlapped_ms"] = z["overlapped"] * us_ms
    res["exposed_comm_ms"] = (z["comm"] - z["overlapped"]) * us_ms
    res["wait_ms"] = z["wait"] * us_ms
    # idle: covered by neither compute nor comm in flight (waits are not compute)
    res["idle_ms"] = (window - z["union"].to_numpy()) * us_ms
    with np.errstate(divide="ignore", invalid="ignore"):
        res["overlap_pct"] = np.where(z["comm"] > 0, 100 * z["overlapped"] / z["comm"], np.nan)
        res["bubble_pct"] = np.where(window > 0, 100 * (1 - z["compute"] / window), np.nan)
    if by == "rank":
        res = res.drop(columns="step")
        theory = theoretical_bubble(df)
        if theory is not None:    # the schedule's, under this trace's own F / B / W times
            res["sim_bubble_pct"], res["formula_bubble_pct"] = theory
    return res.reset_index(drop=True)


def _overlap_by_op(df: pd.DataFrame) -> pd.DataFrame:
    """Exposed comm per (op, group), summed over ranks. Ops of one class are merged; different
    ops in flight at once each count their own time, so rows can add up to more than the total."""
    windows = _windows(df, by_step=False)
    comm = _clip(df[df["kind"] == "comm"], windows)
    cols = ["op", "group", "ops", "bytes", "comm_ms", "overlapped_ms", "exposed_comm_ms",
            "overlap_pct"]
    if not len(comm):
        return pd.DataFrame(columns=cols)
    comm = comm.assign(op=comm["op"].fillna(comm["name"]), group=comm["group"].fillna("?"))
    classes = comm[["rank", "op", "group"]].drop_duplicates().reset_index(drop=True)
    classes["cid"] = np.arange(len(classes))
    comm = comm.merge(classes, on=["rank", "op", "group"])
    busy = _clip(df[df["kind"].isin(["compute", "wait"])], windows)
    # each (rank, op, group) class is swept against its rank's compute (and waits, which are not
    # compute), so those are repeated once per class of its rank (a handful), never per event pair
    rep = busy[["rank", "ts", "end", "kind"]].merge(classes[["rank", "cid"]], on="rank")
    key = np.concatenate([comm["cid"].to_numpy(), rep["cid"].to_numpy()])
    ts = np.concatenate([comm["ts"].to_numpy(), rep["ts"].to_numpy()])
    end = np.concatenate([comm["end"].to_numpy(), rep["end"].to_numpy()])
    cls = np.concatenate([np.ones(len(comm), dtype=np.int64),
                          np.where(rep["kind"].to_numpy() == "wait", 2, 0)])
    keys, lengths, inter0, _ = _sweep(key, ts, end, cls, 3)
    classes.loc[keys, "comm"] = lengths[:, 1]
    classes.loc[keys, "overlapped"] = inter0[:, 1]
    counts = comm.groupby("cid").agg(ops=("ts", "size"), bytes=("bytes", "sum"))
    classes = classes.join(counts, on="cid")
    g = classes.groupby(["op", "group"], as_index=False).agg(
        ops=("ops", "sum"), bytes=("bytes", "sum"), comm=("comm", "sum"),
        overlapped=("overlapped", "sum"))
    g["comm_ms"] = g["comm"] * 1e-3
    g["overlapped_ms"] = g["overlapped"] * 1e-3
    g["exposed_comm_ms"] = (g["comm"] - g["overlapped"]) * 1e-3
    g["overlap_pct"] = np.where(g["comm"] > 0, 100 * g["overlapped"] / g["comm"].where(g["comm"] > 0),
                                np.nan)
    return g[cols].sort_values("exposed_comm_ms", ascending=False).reset_index(drop=True)


# ---------------------------------------------------------------- theory, step times, HTA


def theoretical_bubble(df: pd.DataFrame):
    """For pipeline runs (metadata plan.pp > 1), under the measured mean F, B, W span times: the
    simulator's bubble % per rank (kernels.pp.simulate) and the published formula's bubble as a %
    of the simulated step (one figure: the formulas assume equal stages); None when it does not apply."""
    meta = df.attrs.get("metadata") or {}
    plan = meta.get("plan") or {}
    pp = int(plan.get("pp") or 1)
    if pp <= 1:
        return None
    comp = df[df["kind"] == "compute"]
    mean = comp.groupby("cat")["dur"].mean()
    f, b, w, fb = (float(mean.get(k, np.nan)) for k in ("F", "B", "W", "FB"))
    if not np.isfinite(f) or not np.isfinite(b):
        return None
    w = w if np.isfinite(w) else 0.0
    name = plan.get("schedule", "1f1b")
    try:  # virtual stages only mean something to the interleaved schedule
        sched = build_schedule(name, pp, int(plan.get("microbatches", 1)),
                               plan.get("virtual_stages") if name == "interleaved" else None)
        cost = Cost(F=f, B=b + w, W=w)  # Cost.B is the full backward
        if np.isfinite(fb):
            cost = Cost(F=f, B=b + w, W=w, FB=fb)
        res = simulate(sched, cost)
        formula = formula_bubble(name, pp, cost, int(plan.get("virtual_stages") or 1))[0]
    except (ValueError, TypeError):
        return None
    per_stage = np.asarray(res.bubble_per_rank, dtype=float) / res.makespan * 100
    coords = meta.get("coords") or {}
    ranks = sorted(df["rank"].unique())
    stage = [_pp_coord(coords.get(str(r), ""), r) for r in ranks]
    sim = np.array([per_stage[s] if s < len(per_stage) else np.nan for s in stage])
    return sim, np.full(len(ranks), 100 * formula / res.makespan)


def oversubscription_note(df: pd.DataFrame) -> str | None:
    """A line for reports of a trace whose ranks outnumbered the cores they shared, else None."""
    meta = df.attrs.get("metadata") or {}
    cpus, ranks = meta.get("cpus"), df["rank"].nunique() if len(df) else 0
    if not cpus or ranks <= cpus:
        return None
    return (f"note: {ranks} ranks shared {cpus} CPU cores and took turns on them, so spans stretch and the "
            f"measured bubble includes time a rank was ready but had no core"
            + ("; sim_bubble_pct is the schedule's own under the measured F/B/W times"
               if int((meta.get("plan") or {}).get("pp") or 1) > 1 else ""))


def _pp_coord(coords: str, rank: int) -> int:
    m = re.search(r"pp(\d+)", coords or "")
    return int(m.group(1)) if m else int(rank)


def step_times(df: pd.DataFrame) -> pd.DataFrame:
    """Per step: the wall time from the first rank's start to the last rank's end, in ms."""
    steps = df[df["kind"] == "step"]
    if not len(steps):
        w = _windows(df, by_step=False)
        return pd.DataFrame({"step": [0], "step_ms": [(w["w1"].max() - w["w0"].min()) * 1e-3]})
    g = steps.groupby("step").agg(t0=("ts", "min"), t1=("end", "max"))
    return pd.DataFrame({"step": g.index.astype(int), "step_ms": ((g["t1"] - g["t0"]) * 1e-3).to_numpy()})


def hta_overlap(df: pd.DataFrame) -> pd.DataFrame:
    """HTA's comm-comp overlap % per rank: GPU kernels only, NCCL against the rest, each merged.
    On CPU traces there are no kernels and, as with HTA, the figure is NaN."""
    ranks = sorted(df["rank"].unique())
    gpu = df[(df["device"] == "gpu") & df["kind"].isin(["compute", "comm"])]
    out = pd.DataFrame({"rank": ranks, "comm_comp_overlap_pct": np.nan})
    if len(gpu):
        cls = (gpu["kind"] == "comm").to_numpy().astype(np.int64)
        keys, lengths, inter0, _ = _sweep(gpu["rank"].to_numpy(), gpu["ts"].to_numpy(),
                                          gpu["end"].to_numpy(), cls, 2)
        with np.errstate(divide="ignore", invalid="ignore"):
            pct = np.where(lengths[:, 1] > 0, 100 * inter0[:, 1] / lengths[:, 1], np.nan)
        out = out.set_index("rank")
        out.loc[keys, "comm_comp_overlap_pct"] = pct
        out = out.reset_index()
    return out
