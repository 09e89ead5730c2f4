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

import numpy as np

from partui.analysis.reading.kineto_lean import NotLean, lean_pairs, read_gpu_trace
from partui.analysis.gpu.pair_parts import SIDE, PairsRead, recorded_window_ms, rows_of
from planning.pipeline.fb_order import OrderedPart, PartCost, run_parts
from planning.pipeline.part_costs import pair_timeline

MEASURED = {"ATTN": ("ATTN", "F"), "MLP": ("MLP", "F"), "ATTN_B": ("ATTN", "B"), "MLP_B": ("MLP", "B"),
            "ATTN_W": ("ATTN", "W"), "MLP_W": ("MLP", "W")}
PLANNER_NAME = {("ATTN", "F"): "F ATTN", ("MLP", "F"): "F MLP", ("ATTN", "B"): "B ATTN", ("MLP", "B"): "B MLP",
                ("ATTN", "W"): "B ATTN_W", ("MLP", "W"): "B MLP_W"}


def sides(table: dict) -> list:
    """Each row's side (F / B / W) from its annotation, None where it names none."""
    return [m.group(1) if m else None for m in map(SIDE.search, table["annotation"])]


def mean_of(table: dict, column: str, rows: list) -> float:
    return float(np.mean(np.array([table[column][i] for i in rows], dtype=float)))


def measured_costs(table: dict) -> PartCost:
    """The planner's part costs from one rank's pair table (pair_parts.pair_columns', a list a column)."""
    side = sides(table)
    values = {}
    for key, (part, s) in MEASURED.items():
        rows = [i for i, (p, d) in enumerate(zip(table["part"], side)) if (p, d) == (part, s)]
        if rows:
            values[key] = mean_of(table, "gpu_ms", rows)
    a2a = [i for i, p in enumerate(table["part"]) if p in ("DISPATCH", "COMBINE")]
    if not a2a or "ATTN" not in values or "MLP" not in values:
        raise ValueError("the trace's part annotations lack attn(F), mlp(F) or an all-to-all part: no part "
                         "costs to plan with (see pair_parts.PART_NAMES)")
    for kind in ("DISPATCH", "COMBINE"):
        for s in "FB":
            rows = [i for i in a2a if (table["part"][i], side[i]) == (kind, s)]
            if rows:
                values[f"A2A_{kind}_{s}"] = mean_of(table, "a2a_ms", rows)
    return PartCost(COMBINE=0.0, A2A=mean_of(table, "a2a_ms", a2a), layers=len(set(table["layer_k"])), **values)


def recorded_order(table: dict) -> list[OrderedPart]:
    """The recorded compute parts in launch order as the pair model's parts, so TwoStreams can replay them:
    the all-to-all annotations are no parts (the model issues each at its part's end); combine(B) is the
    backward's COMBINE part (it issues that all-to-all); the forward's COMBINE (0 long, where the combined
    rows are waited) runs just before the forward's next part, or last."""
    side = sides(table)
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


def recorded_compute_order(table: dict) -> list[str]:
    """The recorded compute parts in launch order, in the planner's words ("F ATTN", "B MLP_W" ...)."""
    side = sides(table)
    return [PLANNER_NAME[(p, s)] for p, s in zip(table["part"], side) if (p, s) in PLANNER_NAME]


def side_by_side(table: dict, recorded_ms: float) -> str:
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
             f"compute kernel beside it {float(np.sum(table['a2a_exposed_ms'])):.3f} ms)",
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


def planner_beside(path: str, read: PairsRead) -> tuple[PartCost, str]:
    """(the measured part costs, the side-by-side text) of the first rank with part annotations, as either
    reader read them (pair_parts.read_pairs). ValueError where there are no parts, or they give no costs
    to plan with."""
    if not len(read.parts.rank):
        raise ValueError(f"{path or 'the trace'}: no part annotations (names as pair_parts.PART_NAMES lists, "
                         f"e.g. attn(F)); give --parts as ATTN=1,MLP=1,A2A=1,layers=1 instead")
    rank = int(read.parts.rank.min())
    mine = rows_of(read.table, rank)
    recorded = recorded_window_ms(read.owner, read.k_rank, read.k_ts, read.k_end, rank)
    return measured_costs(mine), f"{path} rank {rank}:\n" + side_by_side(mine, recorded)


def from_trace(path: str) -> tuple[PartCost, str]:
    """planner_beside of a torch.profiler trace file (`partui simulate --parts TRACE`): read without pandas
    where kineto_lean serves the file, else as the analysis table."""
    try:
        read = lean_pairs(read_gpu_trace(path))
    except NotLean:
        from partui.analysis.figures.kineto_pairs import frame_pairs
        from partui.analysis.reading.reader import load
        read = frame_pairs(load(path))
    return planner_beside(path, read)
