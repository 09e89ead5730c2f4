"""A recorded pipeline step against the ideal one: each rank's actions in recorded order beside the
simulator's timeline for the same schedule under the trace's own F / B / W costs
(pipeline.simulated), with each action's lateness and why (`partui report TRACE --by schedule`).

Times are ms from the step's first action (any rank) and, for the simulator, from its start.
    late_ms      recorded start - simulated start
    waited_ms    the action's waits inside it (blocked on a peer's send: its input had not arrived)
    no_core_ms   its wall time outside waits less its thread CPU time (runnable, no core)
    why          "a peer's send" or "a core", whichever of the two took more of the action (over
                 5% of it), else "nothing": the action itself ran as long as its cost says; its
                 lateness was inherited from earlier actions
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.table.events import TraceError
from partui.analysis.figures.pipeline import pp_coord, simulated
from partui.analysis.table.sweep import clip, windows_of
from partui.analysis.figures.timing import actions

WHY_SHARE = 0.05  # a cause must take over 5% of the action to be named


def schedule_view(df: pd.DataFrame, step: int | None = None) -> pd.DataFrame:
    """One row per (rank, action) of `step` (default: the last step traced)."""
    sim = simulated(df)  # the ideal: mean F / B / W, comm free, so lateness shows what comm and cores cost
    if sim is None:
        raise TraceError("no pipeline schedule in this trace (a partui trace of a run with --pp 2 "
                         "or more and F / B actions); use --by rank")
    res = sim[0]
    every = windows_of(df, by_step=True)
    step = int(every["step"].max()) if step is None else int(step)
    windows = every[every["step"] == step]
    if not len(windows):
        raise TraceError(f"step {step} is not in this trace; pick one of its steps "
                         f"({', '.join(str(int(s)) for s in sorted(every['step'].unique()))})")
    acts = clip(actions(df), windows).sort_values(["rank", "ts"], kind="stable")
    waits = clip(df[df["cat"] == "wait"], windows)
    t0 = acts["ts"].min()
    coords = (df.attrs.get("metadata") or {}).get("coords") or {}
    rows = []
    for rank, mine in acts.groupby("rank"):
        ideal = res.spans[pp_coord(coords.get(str(rank), ""), rank)]
        w = waits[waits["rank"] == rank]
        for k, a in enumerate(mine.itertuples(index=False)):
            kind = str(a.name).split()[0]
            s0, s1, planned = ideal[k] if k < len(ideal) else (np.nan, np.nan, None)
            if planned is not None and planned.kind != kind:  # recorded order left the schedule's
                s0 = s1 = np.nan
            inside = np.clip(np.minimum(w["end"], a.end) - np.maximum(w["ts"], a.ts), 0, None).sum()
            wall = a.end - a.ts
            no_core = max(0.0, wall - inside - a.cpu_us) if a.cpu_us == a.cpu_us else np.nan
            why = "nothing"
            if max(inside, np.nan_to_num(no_core)) > WHY_SHARE * wall:
                why = "a peer's send" if inside >= np.nan_to_num(no_core) else "a core"
            rows.append({"rank": int(rank), "k": k, "action": str(a.name),
                         "start_ms": (a.ts - t0) / 1e3, "dur_ms": wall / 1e3,
                         "sim_start_ms": s0 / 1e3, "sim_dur_ms": (s1 - s0) / 1e3,
                         "late_ms": (a.ts - t0 - s0) / 1e3, "waited_ms": inside / 1e3,
                         "no_core_ms": no_core / 1e3, "why": why})
    return pd.DataFrame(rows)
