"""Chunk-level costs for the simulator: a layer's parts on the pair model of planning/pipeline/fb_order.py (its
PartCost, and TwoStreams: one compute stream, one comm stream, which run_parts replays an order on), so a plain
F, a plain BW and an overlapped F&B pair each get a duration from the same part costs, and `partui simulate`
can draw the pair's inner order. One model chunk is `layers` MoE layers.
A plain forward or backward (no pair) runs its parts in model order, input grads then weight grads per
layer, as kernels/pp/stages.py does, so each all-to-all is waited right after it is issued.
"""
from __future__ import annotations

from planning.pipeline.fb_order import (PART_KEYS, OrderedPart, PartCost, PartTimeline, pair_order, run_parts,
                                        serial_order)
from planning.pipeline.simulate import Cost

# PART_KEYS, PartCost, PartTimeline and run_parts live with the pair model; the simulator's CLI takes them from here
__all__ = ["PART_KEYS", "PartCost", "PartTimeline", "run_parts", "pair_timeline", "cost_from_parts", "text_pair"]


def _plain_backward(kinds: list[str]) -> list[OrderedPart]:
    """A plain backward as the executor runs it: per layer (reversed), its input-grad parts then its W parts."""
    parts = serial_order("B", kinds)
    out = []
    for k in range(len(kinds)):
        mine = [p for p in parts if p.layer == k]
        out += [p for p in mine if not p.weight] + [p for p in mine if p.weight]
    return out


def pair_timeline(cost: PartCost, overlapped: bool = True) -> PartTimeline:
    """One F&B pair of two chunks of `layers` MoE layers each: overlapped (the order pair_order plans under
    these same costs), or one side after the other."""
    kinds = ["moe"] * cost.layers
    if overlapped:
        return run_parts(pair_order(kinds, kinds, cost=cost), cost)
    return run_parts(serial_order("F", kinds) + _plain_backward(kinds), cost)


def cost_from_parts(cost: PartCost, fb_overlap: bool, p2p: float = 0.0) -> Cost:
    """The simulator's chunk costs: F and B (full) run alone, W the weight-grad parts, FB the overlapped pair
    (fb_overlap) or F + B one after the other."""
    kinds = ["moe"] * cost.layers
    f = run_parts(serial_order("F", kinds), cost).makespan
    b = run_parts(_plain_backward(kinds), cost).makespan
    w = cost.layers * (cost.of("B", "ATTN_W") + cost.of("B", "MLP_W"))
    fb = pair_timeline(cost, fb_overlap).makespan
    return Cost(F=f, B=b, W=w, FB=fb, p2p=p2p)


def text_pair(cost: PartCost, width: int = 100) -> str:
    """The pair's inner order: a compute row and a comm row on one time axis, then each part with what it
    hides; closes with the pair's time against the two sides one after the other."""
    tl = pair_timeline(cost)
    serial = pair_timeline(cost, overlapped=False).makespan
    durations = [e - b for b, e, *_ in tl.compute + tl.comm if e > b]
    quantum = max(min(durations, default=1.0), tl.makespan / width) if tl.makespan else 1.0
    cols = int(round(tl.makespan / quantum)) if tl.makespan else 0

    def row(spans, letter):
        cells = []
        for c in range(cols):
            mid = (c + 0.5) * quantum
            hit = [s for s in spans if s[0] <= mid < s[1]]
            cells.append(letter(hit[0][2]) if hit else "·")
        return "".join(cells)

    def code(label):                   # "F ATTN L0" -> "a" forward, "A" backward; W parts "w"
        side, part = label.split()[:2]
        ch = "w" if part.endswith("_W") else {"ATTN": "a", "MLP": "m", "COMBINE": "c"}[part]
        return ch.upper() if side == "B" and ch != "w" else ch

    def comm_code(label):              # "DISPATCH(F) L0" -> "d" forward, "D" backward
        ch = label[0].lower()
        return ch.upper() if "(B)" in label else ch

    lines = [f"F&B pair, {cost.layers} MoE layer(s) a side: compute │{row(tl.compute, code)}",
             f"{' ' * (len(f'F&B pair, {cost.layers} MoE layer(s) a side: ') - 5)}comm │{row(tl.comm, comm_code)}",
             "  (forward lower case, backward upper: a/A ATTN, m/M MLP, c/C COMBINE, w weight grads; "
             "comm d/D DISPATCH, c/C COMBINE)"]
    for b, e, label, hides in tl.compute:
        lines.append(f"  {b:6.2f}-{e:6.2f}  {label:<14}" + (f" under {hides}" if hides else ""))
    exposed = tl.exposed_comm
    total = sum(e - b for b, e, *_ in tl.comm)
    lines.append(f"  pair {tl.makespan:g} vs {serial:g} one side after the other; all-to-all {total:g}, "
                 f"exposed {exposed:g} ({100 * (1 - exposed / total) if total else 100:.0f}% hidden)")
    return "\n".join(lines)
