"""Pipeline figures of a trace: each rank's pipeline window in a step (its first to last F / B / W
action), and the schedule's own bubble under the trace's F / B / W costs (kernels.pp.simulate),
measured on the same basis so the two can be set side by side.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from kernels.pp.schedules import build_schedule
from kernels.pp.simulate import Cost, formula_bubble, simulate
from partui.analysis.sweep import clip

ACTION_CATS = ("F", "B", "W", "FB")  # the executor's action spans carry a chunk; layer spans do not


def actions(df: pd.DataFrame) -> pd.DataFrame:
    """The pipeline executor's action spans (F, B / BW, W, FB pairs)."""
    return df[df["cat"].isin(ACTION_CATS) & df["chunk"].notna()
              & df["kind"].isin(["compute", "container"])]


def pipeline_windows(df: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame | None:
    """[wid, rank, step, w0, w1]: per step window, the rank's first action start to its last
    action end (wid the step window's); None when the trace has no pipeline actions."""
    acts = actions(df)
    if not len(acts):
        return None
    pieces = clip(acts[["rank", "ts", "end"]], windows)
    if not len(pieces):
        return None
    w = pieces.groupby("wid").agg(w0=("ts", "min"), w1=("end", "max"))
    out = windows.set_index("wid").loc[w.index, ["rank", "step"]].join(w).reset_index()
    return out.sort_values(["rank", "w0"])[["wid", "rank", "step", "w0", "w1"]].reset_index(drop=True)


def action_costs(df: pd.DataFrame) -> dict:
    """Mean compute time (us) inside each action kind: its span less the waits inside it, so a
    recv waited inside an F is not counted as F's cost. Actions of a rank never overlap, so each
    wait belongs to the last action that began before it (an as-of join, not a sweep)."""
    acts = actions(df)
    if not len(acts):
        return {}
    acts = acts.assign(aid=np.arange(len(acts)))[["rank", "ts", "end", "dur", "cat", "aid"]]
    waits = df[df["kind"] == "wait"][["rank", "ts", "end"]]
    left = waits.sort_values("ts", kind="stable")
    joined = pd.merge_asof(left, acts.sort_values("ts", kind="stable")[["rank", "ts", "end", "aid"]]
                           .rename(columns={"end": "a_end"}), on="ts", by="rank")
    inside = (np.minimum(joined["end"], joined["a_end"]) - joined["ts"]).clip(lower=0).fillna(0.0)
    waited = inside.groupby(joined["aid"]).sum()
    busy = acts["dur"] - acts["aid"].map(waited).fillna(0.0)
    return busy.groupby(acts["cat"].astype(str)).mean().to_dict()


def simulated(df: pd.DataFrame):
    """(SimResult, Cost, plan) of the trace's schedule (metadata plan.pp > 1) under the trace's own
    mean F, B, W compute; None when it does not apply."""
    meta = df.attrs.get("metadata") or {}
    plan = meta.get("plan") or {}
    pp = int(plan.get("pp") or 1)
    if pp <= 1:
        return None
    mean = action_costs(df)
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
        return simulate(sched, cost), cost, plan
    except (ValueError, TypeError):
        return None


def theoretical_bubble(df: pd.DataFrame, ranks=None):
    """For pipeline runs, under the trace's own mean F, B, W compute: the simulator's bubble % per
    rank in that rank's own pipeline window (first to last action, as pipe_bubble_pct is
    measured), and the published formula's bubble as a % of the simulated step (one figure: the
    formulas assume equal stages); None when it does not apply."""
    sim = simulated(df)
    if sim is None:
        return None
    res, cost, plan = sim
    try:
        formula = formula_bubble(plan.get("schedule", "1f1b"), int(plan["pp"]), cost,
                                 int(plan.get("virtual_stages") or 1))[0]
    except (ValueError, TypeError):
        return None
    per_stage = []
    for spans in res.spans:
        first, last = min(s[0] for s in spans), max(s[1] for s in spans)
        busy = sum(s[1] - s[0] for s in spans)
        per_stage.append(100 * (1 - busy / (last - first)) if last > first else np.nan)
    coords = (df.attrs.get("metadata") or {}).get("coords") or {}
    ranks = sorted(df["rank"].unique()) if ranks is None else list(ranks)
    stage = [pp_coord(coords.get(str(r), ""), r) for r in ranks]
    out = np.array([per_stage[s] if s < len(per_stage) else np.nan for s in stage])
    return out, np.full(len(ranks), 100 * formula / res.makespan)


def pp_coord(coords: str, rank: int) -> int:
    m = re.search(r"pp(\d+)", coords or "")
    return int(m.group(1)) if m else int(rank)
