"""The schedule's own bubble of a pipeline trace (planning.pipeline.simulate), measured on the basis of
pipe_bubble_pct (each rank's first to last action in a step) so the two can be set side by side: under
each step's own timing (each rank's compute, post and dispatch times, the measured per-edge transfer:
partui.analysis.figures.timing) and ideally (mean F / B / W, comm free).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from partui.analysis.table.sweep import windows_of
from partui.analysis.figures.timing import action_compute, action_costs, step_timings
from planning.mesh import Plan
from planning.pipeline.catalog import DEFAULT_SCHEDULE, formula_bubble, plan_schedule
from planning.pipeline.simulate import Cost, simulate


def trace_schedule(df: pd.DataFrame, acts: pd.DataFrame | None = None):
    """(Schedule, ideal Cost, plan) of the trace's pipeline (metadata plan.pp > 1) under its mean F, B, W
    compute (acts: timing.action_compute(df), when the caller has it); None when it does not apply."""
    meta = df.attrs.get("metadata") or {}
    plan = meta.get("plan") or {}
    pp = int(plan.get("pp") or 1)
    if pp <= 1:
        return None
    mean = action_costs(df, acts)
    f, b, w, fb = (float(mean.get(k, np.nan)) for k in ("F", "B", "W", "FB"))
    if not np.isfinite(f) or not np.isfinite(b):
        return None
    w = w if np.isfinite(w) else 0.0
    try:
        sched = plan_schedule(Plan.from_dict(plan))   # the schedule the executor ran
        cost = Cost(F=f, B=b + w, W=w) if not np.isfinite(fb) else Cost(F=f, B=b + w, W=w, FB=fb)
        return sched, cost, plan
    except (ValueError, TypeError):  # Cost.B is the full backward
        return None


def simulated(df: pd.DataFrame):
    """(SimResult, Cost, plan) of the trace's schedule, ideal: mean F, B, W over all ranks and steps,
    comm free (`--by schedule` measures lateness against it); None when it does not apply."""
    found = trace_schedule(df)
    if found is None:
        return None
    sched, cost, plan = found
    try:
        return simulate(sched, cost), cost, plan
    except (ValueError, TypeError):
        return None


def stage_windows(res, measured: bool = True) -> pd.DataFrame:
    """Per stage: [stage, window, busy] of a simulated step. measured=True, on the basis of a recorded
    action span: from when the rank reached its first compute (an action span begins before it waits
    for its input) to its last compute's end and through the sends posted right after it (the
    executor posts a compute's sends inside its span); else first compute start to last end."""
    rows = []
    for r, spans in enumerate(res.spans):
        first, last = min(s[0] for s in spans), max(s[1] for s in spans)
        if measured and res.reached:
            first = min(res.reached[r])
        for p0, p1, a in (res.posts[r] if res.posts else []):
            if a.kind.startswith("SEND") and p0 == last:
                last = p1
        rows.append((r, last - first, sum(s[1] - s[0] for s in spans)))
    return pd.DataFrame(rows, columns=["stage", "window", "busy"])


def simulated_steps(df: pd.DataFrame, windows: pd.DataFrame | None = None, pipe: pd.DataFrame | None = None,
                    acts: pd.DataFrame | None = None):
    """The simulations of a pipeline trace: (per-step frame [stage, step, window, busy] under each
    step's own timing, the ideal SimResult, the formula's bubble), or None when they do not apply.
    windows (windows_of), pipe (timing.pipeline_windows) and acts (timing.actions): when the caller
    has them. Steps of equal Timing are simulated once."""
    if int(((df.attrs.get("metadata") or {}).get("plan") or {}).get("pp") or 1) <= 1:
        return None
    acts = action_compute(df, acts)  # once: both simulations take their costs from it
    found = trace_schedule(df, acts)
    if found is None:
        return None
    sched, cost, plan = found
    try:
        ideal = simulate(sched, cost)
        formula = formula_bubble(plan.get("schedule", DEFAULT_SCHEDULE), int(plan["pp"]), cost,
                                 int(plan.get("virtual_stages") or 1))[0]
        if windows is None:
            windows = windows_of(df, by_step=bool((df["kind"] == "step").any()))
        seen = {}  # a step timed like one before it replays to the same windows
        per_step = []
        for s, t in step_timings(df, windows, acts, pipe).items():
            shape = _timing_key(t)
            if shape not in seen:
                seen[shape] = stage_windows(simulate(sched, cost, t))
            per_step.append(seen[shape].assign(step=s))
    except (ValueError, TypeError):
        return None
    sims = pd.concat(per_step) if per_step else pd.DataFrame(columns=["stage", "window", "busy", "step"])
    return sims, ideal, formula


def _timing_key(t) -> tuple:
    """A Timing as a hashable value: equal keys, equal simulations."""
    return tuple(tuple(sorted(getattr(t, f).items(), key=repr)) for f in ("compute", "dispatch", "post", "latency"))


def theoretical_bubble(df: pd.DataFrame, keys: pd.DataFrame | None = None, sims=None):
    """For pipeline runs, per row of `keys` ([rank] or [rank, step]; default every rank), in the
    rank's own pipeline windows (first to last action, as pipe_bubble_pct is measured, summed over the
    steps of a rank row): the simulator's bubble % under each step's own timing (each rank's compute,
    posts, dispatch and per-edge transfer: timing.step_timings), the simulator's ideal one (mean F, B,
    W over ranks, comm free), and the published formula's bubble as a % of the ideal simulated step
    (one figure: the formulas assume equal stages); None when it does not apply. `sims`:
    simulated_steps(df), when the caller has it."""
    sims = simulated_steps(df) if sims is None else sims
    if sims is None:
        return None
    per_step, ideal, formula = sims
    if keys is None:
        keys = pd.DataFrame({"rank": sorted(df["rank"].unique())})
    coords = (df.attrs.get("metadata") or {}).get("coords") or {}
    k = keys.assign(stage=[pp_coord(coords.get(str(r), ""), r) for r in keys["rank"]])
    if "step" in k:
        k["step"] = k["step"].astype(float)
    ideal_w = stage_windows(ideal, measured=False).set_index("stage")
    with np.errstate(divide="ignore", invalid="ignore"):
        sim_ideal = 100 * (1 - ideal_w["busy"] / ideal_w["window"]).reindex(k["stage"]).to_numpy()
        on = ["stage", "step"] if "step" in k else ["stage"]
        summed = per_step.groupby(on)[["window", "busy"]].sum()
        got = k.join(summed, on=on)
        sim = 100 * (1 - got["busy"] / got["window"]).to_numpy(dtype=float)
    return sim, sim_ideal, np.full(len(k), 100 * formula / ideal.makespan)


def pp_coord(coords: str, rank: int) -> int:
    m = re.search(r"pp(\d+)", coords or "")
    return int(m.group(1)) if m else int(rank)
