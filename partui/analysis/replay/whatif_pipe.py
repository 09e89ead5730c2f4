"""What-if for pipelines: another pp size or microbatch count, through the schedule simulator
(planning.pipeline.simulate) under the trace's own measured compute and the link's p2p cost.

From the recorded trace (a pipeline run, pp >= 2):
    per microbatch, the whole model's F, B, W (and FB pair) = the trace's mean action of that kind
        (its span less the waits inside it, partui.analysis.figures.timing.action_costs) x the stages
        one microbatch crosses (Schedule.stages: pp, pp x v interleaved, 2 pp for dualpipev)
    the activation bytes one microbatch sends = the mean bytes of the trace's pipeline sends
For the new plan (pp', M'; the global batch and dp stay, so a microbatch holds M/M' of the tokens):
    a chunk costs the model's share of its stages, x M/M' (compute taken as linear in tokens)
    p2p = the link's send cost (latency + bytes x M/M' / bandwidth) between adjacent stages
    the pipeline window = the simulator's makespan; the step adds the rest outside it (loss
    all-reduce, grad sync, optimizer) as recorded (_rest_ms), mean over the trace's steps.
A change the plan cannot take (pp not dividing the layers, too few microbatches for the
schedule, a per-rank batch the microbatches do not divide) is refused by planning.validate with
its own fix.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.figures.definitions import defined
from partui.analysis.table.events import TraceError
from partui.analysis.reading.reader import frame
from partui.analysis.figures.timing import action_costs, actions
from planning.config import ModelConfig
from planning.link import LinkModel
from planning.mesh import Plan, partition
from planning.pipeline.catalog import plan_schedule
from planning.pipeline.simulate import Cost, simulate
from planning.validate import plan_for_model

# per new stage (defined in partui.analysis.figures.definitions, view "whatif --pp")
STAGE_COLUMNS = ("stage", "sim_pipe_ms", "sim_bubble_pct", "rest_ms", "predicted_step_ms")


def new_plan(meta: dict, pp: int | None, microbatches: int | None) -> tuple[Plan, Plan]:
    """(recorded plan, the plan with pp / microbatches changed, validated); ValueError naming the
    problem and a fix (planning.validate's) when the change is impossible."""
    if "plan" not in meta or "model" not in meta:
        raise TraceError("the trace has no plan metadata: record it with partui run --trace")
    old = Plan.from_dict(meta["plan"])
    if old.pp < 2:
        raise ValueError(f"pp={pp or old.pp} microbatches={microbatches or old.microbatches} "
                         f"changes a pipeline, and this trace ran pp {old.pp}: record one with "
                         f"pp=2 or more")
    want = {**old.to_dict(), "pp": pp or old.pp, "microbatches": microbatches or old.microbatches,
            "world": 0}
    return old, plan_for_model(want, ModelConfig(**meta["model"]))[0]


def _send_bytes(doc: dict) -> float:
    sizes = [e["args"].get("bytes") or 0 for e in doc["traceEvents"]
             if e.get("ph") == "X" and e.get("cat") == "comm"
             and (e.get("args") or {}).get("op") == "send"
             and (e.get("args") or {}).get("group") == "pp"]
    return float(np.mean(sizes)) if sizes else 0.0


def _p2p_seconds(plan: Plan, link: LinkModel, nbytes: float) -> float:
    """The slowest adjacent-stage send of the plan under the link (stages may sit on two nodes)."""
    worst = 0.0
    for group in partition(plan, "pp"):
        for a, b in zip(group, group[1:]):
            lat, tr = link.cost("send", [a, b], int(nbytes))
            worst = max(worst, lat + tr)
    return worst


def _rest_ms(df: pd.DataFrame) -> float:
    """The step outside the pipeline: before the first rank's first action, plus after the last
    action, on the rank that ends latest (loss all-reduce, grad sync, optimizer); mean over the
    steps (the first left out as a warm-up when there are more). A rank's own wait for its first
    activation is the pipeline's fill, which the simulator's makespan already holds."""
    steps = df[df["kind"] == "step"][["rank", "step", "ts", "end"]]
    acts = actions(df)
    if not len(acts) or not len(steps):
        return 0.0
    inside = pd.merge_asof(acts[["rank", "ts", "end"]].sort_values("ts"),
                           steps.rename(columns={"ts": "s0", "end": "s1"}).sort_values("s0"),
                           left_on="ts", right_on="s0", by="rank")   # each action's step
    a = inside.groupby(["rank", "step"]).agg(a0=("ts", "min"), a1=("end", "max")).reset_index()
    m = steps.merge(a, on=["rank", "step"])
    m = m.assign(before=m["a0"] - m["ts"], after=m["end"] - m["a1"])
    g = m.groupby("step")
    per = (g["before"].min() + g["after"].max()) / 1e3
    return float((per.iloc[1:] if len(per) > 1 else per).mean())


def repipe(doc: dict, link: LinkModel, pp: int | None = None,
           microbatches: int | None = None) -> tuple[pd.DataFrame, dict]:
    """(per new stage: predicted pipe / rest / step ms and simulated bubble %, the step's figures
    with the costs used). See the module doc for every assumption."""
    meta = doc.get("metadata") or {}
    old, new = new_plan(meta, pp, microbatches)
    df = frame(doc)
    mean = action_costs(df)                                      # us per action kind
    if not np.isfinite(mean.get("F", np.nan)) or not np.isfinite(mean.get("B", np.nan)):
        raise TraceError("the trace has no F / B pipeline actions: record a pipeline step "
                         "(partui run --pp 2 --trace T)")
    rec_s, new_s = plan_schedule(old), plan_schedule(new)
    tokens = old.microbatches / new.microbatches                 # a new microbatch's share
    per = {k: v * rec_s.stages for k, v in mean.items() if k in ("F", "B", "W", "FB")}
    chunk = tokens / (new_s.stages * new_s.cost_scale)
    f, b, w = (per.get(k, 0.0) * chunk for k in ("F", "B", "W"))
    p2p = _p2p_seconds(new, link, _send_bytes(doc) * tokens) * 1e6
    cost = Cost(F=f, B=b + w, W=w, FB=per["FB"] * chunk if "FB" in per else None, p2p=p2p)
    res = simulate(new_s, cost)
    rest = _rest_ms(df)
    rows = []
    for stage, spans in enumerate(res.spans):
        first, last = min(s[0] for s in spans), max(s[1] for s in spans)
        busy = sum(s[1] - s[0] for s in spans)
        rows.append({"stage": stage, "sim_pipe_ms": res.makespan / 1e3,
                     "sim_bubble_pct": 100 * (1 - busy / (last - first)) if last > first else None,
                     "rest_ms": rest, "predicted_step_ms": res.makespan / 1e3 + rest})
    step = {"pp": new.pp, "microbatches": new.microbatches, "schedule": new.schedule,
            "world": new.world, "recorded_pp": old.pp, "recorded_microbatches": old.microbatches,
            "F_ms": f / 1e3, "B_ms": (b + w) / 1e3, "W_ms": w / 1e3, "p2p_ms": p2p / 1e3,
            "sim_pipe_ms": res.makespan / 1e3, "rest_ms": rest,
            "predicted_step_ms": res.makespan / 1e3 + rest}
    return defined(pd.DataFrame(rows, columns=list(STAGE_COLUMNS))), step

