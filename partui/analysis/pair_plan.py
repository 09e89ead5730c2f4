"""A recorded F&B pair (a torch.profiler trace's part annotations, kineto_pairs) beside partui's pair planner
(planning/pipeline/fb_order.py's pair_order, behind `--fb-overlap`) fed the same measured part costs:
`partui simulate ... --parts TRACE --fb-overlap`.

Measured costs, per layer, in ms of GPU time (each part's kernels merged, mean over layers): ATTN / MLP
from attn(F) / mlp(F), ATTN_B / MLP_B from the B side, ATTN_W / MLP_W from the W side, A2A the mean
all-to-all (dispatch and combine, F and B); COMBINE (the planner's weighted-sum part) is 0: the profile
folds it into its combine annotations, whose GPU time is the all-to-all. The recorded pair time is the
parts' GPU window (first kernel start to last kernel end).
"""
from __future__ import annotations

import pandas as pd

from partui.analysis.kineto_pairs import annotated_parts, kineto_pairs, part_kernels
from partui.analysis.reader import load
from planning.pipeline.part_costs import PartCost, pair_timeline

MEASURED = {"ATTN": ("ATTN", "F"), "MLP": ("MLP", "F"), "ATTN_B": ("ATTN", "B"), "MLP_B": ("MLP", "B"),
            "ATTN_W": ("ATTN", "W"), "MLP_W": ("MLP", "W")}
PLANNER_NAME = {("ATTN", "F"): "F ATTN", ("MLP", "F"): "F MLP", ("ATTN", "B"): "B ATTN", ("MLP", "B"): "B MLP",
                ("ATTN", "W"): "B ATTN_W", ("MLP", "W"): "B MLP_W"}


def measured_costs(table: pd.DataFrame) -> PartCost:
    """The planner's part costs from a kineto_pairs table (one rank's)."""
    side = table["annotation"].str.extract(r"\(([FBW])\)", expand=False)
    values = {}
    for key, (part, s) in MEASURED.items():
        rows = table[(table["part"] == part) & (side == s)]
        if len(rows):
            values[key] = float(rows["gpu_ms"].mean())
    a2a = table[table["part"].isin(["DISPATCH", "COMBINE"])]
    if not len(a2a) or "ATTN" not in values or "MLP" not in values:
        raise ValueError("the trace's part annotations lack attn(F), mlp(F) or an all-to-all part: no part "
                         "costs to plan with (see kineto_pairs.PART_NAMES)")
    return PartCost(COMBINE=0.0, A2A=float(a2a["a2a_ms"].mean()), layers=int(table["layer_k"].nunique()), **values)


def recorded_compute_order(table: pd.DataFrame) -> list[str]:
    """The recorded compute parts in launch order, in the planner's words ("F ATTN", "B MLP_W" ...)."""
    side = table["annotation"].str.extract(r"\(([FBW])\)", expand=False)
    return [PLANNER_NAME[(p, s)] for p, s in zip(table["part"], side) if (p, s) in PLANNER_NAME]


def side_by_side(table: pd.DataFrame, recorded_ms: float) -> str:
    """The recorded order and the planner's, one above the other (compute parts, layers dropped: the
    planner numbers a backward's layers from the last), where they differ, and the two pair times."""
    cost = measured_costs(table)
    plan = pair_timeline(cost, overlapped=True)
    planned = [" ".join(label.split()[:2]) for b, e, label, _ in plan.compute if e > b]
    recorded = recorded_compute_order(table)
    width = max(len(x) for x in planned + recorded)
    lines = [f"measured part costs (ms, mean of {cost.layers} layers): ATTN={cost.ATTN:.3f} MLP={cost.MLP:.3f} "
             f"ATTN_B={cost.of('B', 'ATTN'):.3f} MLP_B={cost.of('B', 'MLP'):.3f} "
             f"ATTN_W={cost.of('B', 'ATTN_W'):.3f} MLP_W={cost.of('B', 'MLP_W'):.3f} A2A={cost.A2A:.3f}",
             f"recorded pair: {recorded_ms:.3f} ms (the parts' GPU window); planner's pair: {plan.makespan:.3f} ms "
             f"(all-to-all exposed {plan.exposed_comm:.3f} ms)",
             f"  {'#':>3}  {'recorded':<{width}}  {'planner':<{width}}"]
    for i in range(max(len(planned), len(recorded))):
        a = recorded[i] if i < len(recorded) else ""
        b = planned[i] if i < len(planned) else ""
        lines.append(f"  {i:>3}  {a:<{width}}  {b:<{width}}" + ("  <- differs" if a != b else ""))
    return "\n".join(lines + [where_they_differ(recorded, planned)])


def where_they_differ(recorded: list[str], planned: list[str]) -> str:
    """One line: whether the F and B parts run in one order in both, and where each puts the W parts
    (each W part named by the part it follows)."""
    def no_w(order):
        return [p for p in order if not p.endswith("_W")]

    def w_after(order):
        return sorted({f"{p} after {order[i - 1] if i else 'start'}" for i, p in enumerate(order) if p.endswith("_W")})
    a, b = no_w(recorded), no_w(planned)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
    same = ("the F and B parts run in the same order in both" if first is None
            else f"the F and B parts part ways at their #{first}")
    return (f"where they differ: {same}; recorded W parts: {', '.join(w_after(recorded)) or 'none'}; "
            f"planner's: {', '.join(w_after(planned)) or 'none'}")


def recorded_window_ms(kernels: pd.DataFrame) -> float:
    """The GPU window of the kernels the parts launched (part_id >= 0), in ms."""
    mine = kernels[kernels["part_id"] >= 0]
    return float(mine["end"].max() - mine["ts"].min()) * 1e-3 if len(mine) else 0.0


def from_trace(path: str) -> tuple[PartCost, str]:
    """(the measured part costs, the side-by-side text) of a torch.profiler trace's first rank."""
    df = load(path)
    parts = annotated_parts(df)
    if not len(parts):
        raise ValueError(f"{path}: no part annotations (names as kineto_pairs.PART_NAMES lists, e.g. attn(F)); "
                         f"give --parts as ATTN=1,MLP=1,A2A=1,layers=1 instead")
    rank = int(parts["rank"].min())
    table = kineto_pairs(df)
    table = table[table["rank"] == rank].reset_index(drop=True)
    kernels = part_kernels(df, parts)
    recorded = recorded_window_ms(kernels[kernels["rank"] == rank])
    return measured_costs(table), f"{path} rank {rank}:\n" + side_by_side(table, recorded)
