"""A recorded F&B pair (a torch.profiler trace's part annotations, kineto_pairs) beside partui's pair planner
(planning/pipeline/fb_order.py's pair_order, behind `--fb-overlap`), both on the planner's pair model under
the same measured costs: `partui simulate ... --parts TRACE --fb-overlap` and `partui report TRACE --by pair`.

Measured costs, per layer, in ms of GPU time (each part's kernels merged, mean over layers): ATTN / MLP
from attn(F) / mlp(F), ATTN_B / MLP_B from the B side, ATTN_W / MLP_W from the W side, and each of the four
all-to-alls its own (dispatch(F), combine(F), combine(B), dispatch(B): their comm kernels merged; A2A their
mean, for what takes one); COMBINE (the planner's weighted-sum part) is 0: the profile folds it into its
combine annotations, whose GPU time is the all-to-all. Three pair times follow: the planner's order under
those costs, the recorded order of compute parts replayed in the same model (TwoStreams), and the recorded
pair (the parts' GPU window), so the planner's and the recorded order are compared in one model, and the
model against the GPU.
"""
from __future__ import annotations

import pandas as pd

from partui.analysis.kineto_pairs import annotated_parts, kineto_pairs, part_kernels
from partui.analysis.reader import load
from planning.pipeline.fb_order import OrderedPart, PartCost, run_parts
from planning.pipeline.part_costs import pair_timeline

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
    for kind in ("DISPATCH", "COMBINE"):
        for s in "FB":
            rows = a2a[((a2a["part"] == kind) & (side.loc[a2a.index] == s)).to_numpy()]
            if len(rows):
                values[f"A2A_{kind}_{s}"] = float(rows["a2a_ms"].mean())
    return PartCost(COMBINE=0.0, A2A=float(a2a["a2a_ms"].mean()), layers=int(table["layer_k"].nunique()), **values)


def recorded_order(table: pd.DataFrame) -> list[OrderedPart]:
    """The recorded compute parts in launch order as the pair model's parts, so TwoStreams can replay them:
    the all-to-all annotations are no parts (the model issues each at its part's end); combine(B) is the
    backward's COMBINE part (it issues that all-to-all); the forward's COMBINE (0 long, where the combined
    rows are waited) runs just before the forward's next part, or last."""
    side = table["annotation"].str.extract(r"\(([FBW])\)", expand=False)
    order: list[OrderedPart] = []
    owed: list[OrderedPart] = []          # forward COMBINE parts not yet placed

    def place(part: OrderedPart):
        if part.side == "F" and owed:
            order.extend(owed)
            owed.clear()
        order.append(part)
    for p, s, k in zip(table["part"], side, table["layer_k"]):
        k = int(k)
        if (p, s) in PLANNER_NAME:
            o_side, o_part = PLANNER_NAME[(p, s)].split()
            place(OrderedPart(o_side, k, o_part, "", f"L{k}"))
            if (o_side, o_part) == ("F", "MLP"):
                owed.append(OrderedPart("F", k, "COMBINE", "", f"L{k}"))
        elif (p, s) == ("COMBINE", "B"):
            place(OrderedPart("B", k, "COMBINE", "", f"L{k}"))
    return order + owed


def recorded_compute_order(table: pd.DataFrame) -> list[str]:
    """The recorded compute parts in launch order, in the planner's words ("F ATTN", "B MLP_W" ...)."""
    side = table["annotation"].str.extract(r"\(([FBW])\)", expand=False)
    return [PLANNER_NAME[(p, s)] for p, s in zip(table["part"], side) if (p, s) in PLANNER_NAME]


def side_by_side(table: pd.DataFrame, recorded_ms: float) -> str:
    """The measured costs; the planner's pair under them, the recorded order replayed in the same model and
    the recorded pair; the two orders of compute parts one above the other (layers dropped: the planner
    numbers a backward's layers from the last), where they differ."""
    cost = measured_costs(table)
    plan = pair_timeline(cost, overlapped=True)
    replay = run_parts(recorded_order(table), cost)
    planned = [" ".join(label.split()[:2]) for b, e, label, _ in plan.compute if e > b]
    recorded = recorded_compute_order(table)
    width = max(len(x) for x in planned + recorded)
    lines = [f"measured part costs (ms, mean of {cost.layers} layers): ATTN={cost.ATTN:.3f} MLP={cost.MLP:.3f} "
             f"ATTN_B={cost.of('B', 'ATTN'):.3f} MLP_B={cost.of('B', 'MLP'):.3f} "
             f"ATTN_W={cost.of('B', 'ATTN_W'):.3f} MLP_W={cost.of('B', 'MLP_W'):.3f}; all-to-alls "
             f"dispatch(F)={cost.a2a('F', 'DISPATCH'):.3f} combine(F)={cost.a2a('F', 'COMBINE'):.3f} "
             f"combine(B)={cost.a2a('B', 'COMBINE'):.3f} dispatch(B)={cost.a2a('B', 'DISPATCH'):.3f} "
             f"(mean A2A={cost.A2A:.3f})",
             f"planner's order, measured costs: {plan.makespan:.3f} ms (all-to-all exposed {plan.exposed_comm:.3f} ms)",
             f"recorded order, same model:      {replay.makespan:.3f} ms (all-to-all exposed {replay.exposed_comm:.3f} ms)",
             f"recorded pair:                   {recorded_ms:.3f} ms (the parts' GPU window; all-to-all with no "
             f"compute kernel beside it {table['a2a_exposed_ms'].sum():.3f} ms)",
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


def recorded_vs_planner(df: pd.DataFrame, table: pd.DataFrame | None = None) -> tuple[PartCost, str]:
    """(the measured part costs, the side-by-side text) of a loaded trace's first rank with part annotations;
    `table`: its kineto_pairs table, where the caller has it. ValueError where there are none."""
    parts = annotated_parts(df)
    if not len(parts):
        raise ValueError(f"{df.attrs.get('path', 'the trace')}: no part annotations (names as kineto_pairs."
                         f"PART_NAMES lists, e.g. attn(F)); give --parts as ATTN=1,MLP=1,A2A=1,layers=1 instead")
    rank = int(parts["rank"].min())
    table = kineto_pairs(df) if table is None else table
    table = table[table["rank"] == rank].reset_index(drop=True)
    kernels = part_kernels(df, parts)
    recorded = recorded_window_ms(kernels[kernels["rank"] == rank])
    return measured_costs(table), f"{df.attrs.get('path', '')} rank {rank}:\n" + side_by_side(table, recorded)


def from_trace(path: str) -> tuple[PartCost, str]:
    """recorded_vs_planner of a torch.profiler trace file."""
    return recorded_vs_planner(load(path))
