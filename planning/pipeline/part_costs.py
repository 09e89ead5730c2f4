"""Chunk-level costs for the simulator: a layer's parts (planning/pipeline/fb_order.py) on one compute stream and its
all-to-alls on one comm stream, so a plain F, a plain BW and an overlapped F&B pair each get a duration
from the same part costs, and `partui simulate` can draw the pair's inner order.

One model chunk is `layers` MoE layers. Part costs, per layer: ATTN and MLP forward; their input grads
(ATTN_B, MLP_B) and weight grads (ATTN_W, MLP_W) default to the forward's (zero-bubble's B = 2F, W = F);
COMBINE (the weighted sum, and its backward) defaults to 0; A2A is one all-to-all. A part starts when the
compute stream is free and the all-to-all it waits for has landed; an all-to-all starts when it is issued
(at the end of its part) and the comm stream is free, and takes A2A.
A plain forward or backward (no pair) runs its parts in model order, input grads then weight grads per
layer, as kernels/pp/stages.py does, so each all-to-all is waited right after it is issued.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from planning.intervals import intersect, length, merge
from planning.pipeline.fb_order import ISSUES, WAITS, OrderedPart, pair_order, serial_order
from planning.pipeline.simulate import Cost

PART_KEYS = ("ATTN", "MLP", "COMBINE", "A2A", "ATTN_B", "MLP_B", "ATTN_W", "MLP_W", "layers")


@dataclass(frozen=True)
class PartCost:
    ATTN: float = 1.0
    MLP: float = 1.0
    COMBINE: float = 0.0
    A2A: float = 1.0
    ATTN_B: float | None = None     # None: ATTN
    MLP_B: float | None = None      # None: MLP
    ATTN_W: float | None = None     # None: ATTN
    MLP_W: float | None = None      # None: MLP
    layers: int = 1                 # MoE layers in one model chunk

    def __post_init__(self):
        for k in PART_KEYS:
            v = getattr(self, k)
            if v is not None and v < 0:
                raise ValueError(f"part cost {k} must be >= 0, got {v}")
        if self.layers < 1 or int(self.layers) != self.layers:
            raise ValueError(f"part cost layers must be a whole number >= 1, got {self.layers}")

    def of(self, side: str, part: str) -> float:
        """Compute time of one part: side F or B, part as fb_order names it (ATTN, MLP_W ...)."""
        if side == "F":
            return {"ATTN": self.ATTN, "MLP": self.MLP, "COMBINE": self.COMBINE}[part]
        pick = {"ATTN": self.ATTN_B, "MLP": self.MLP_B, "ATTN_W": self.ATTN_W, "MLP_W": self.MLP_W}
        if part == "COMBINE":
            return self.COMBINE
        base = self.ATTN if part.startswith("ATTN") else self.MLP
        return base if pick[part] is None else pick[part]


@dataclass
class PartTimeline:
    """Parts on the compute stream and all-to-alls on the comm stream: (start, end, label, hides)."""
    compute: list = field(default_factory=list)
    comm: list = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return max([e for _, e, *_ in self.compute + self.comm], default=0.0)

    @property
    def exposed_comm(self) -> float:
        """All-to-all time with no part computing: the comm stream minus the compute stream."""
        comm = merge([(b, e) for b, e, *_ in self.comm])
        return length(comm) - intersect(merge([(b, e) for b, e, *_ in self.compute]), comm)


def run_parts(order: list[OrderedPart], cost: PartCost) -> PartTimeline:
    """Replay parts in order: compute serial, each all-to-all after its issuing part on one comm stream."""
    tl = PartTimeline()
    clock = comm_free = 0.0
    landed = {}                                  # (side, layer, a2a) -> time its rows are in place
    for p in order:
        start = clock
        need = WAITS.get((p.side, p.part))
        if need is not None and (p.side, p.layer, need) in landed:
            start = max(start, landed.pop((p.side, p.layer, need)))
        end = start + cost.of(p.side, p.part)
        tl.compute.append((start, end, f"{p.side} {p.part} {p.name}", p.hides))
        clock = end
        a2a = ISSUES.get((p.side, p.part))
        if a2a is not None:
            b = max(end, comm_free)
            comm_free = b + cost.A2A
            landed[(p.side, p.layer, a2a)] = comm_free
            tl.comm.append((b, comm_free, f"{a2a}({p.side}) {p.name}", ""))
    return tl


def _plain_backward(kinds: list[str]) -> list[OrderedPart]:
    """A plain backward as the executor runs it: per layer (reversed), its input-grad parts then its W parts."""
    parts = serial_order("B", kinds)
    out = []
    for k in range(len(kinds)):
        mine = [p for p in parts if p.layer == k]
        out += [p for p in mine if not p.weight] + [p for p in mine if p.weight]
    return out


def pair_timeline(cost: PartCost, overlapped: bool = True) -> PartTimeline:
    """One F&B pair of two chunks of `layers` MoE layers each: overlapped, or one side after the other."""
    kinds = ["moe"] * cost.layers
    if overlapped:
        return run_parts(pair_order(kinds, kinds), cost)
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
