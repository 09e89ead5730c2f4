"""The overlapped F&B pair's inner order as data: DeepSeek-V3's chunks of a layer, and the order in which
the forward of one microbatch and the backward of another take them, so each all-to-all of one side is in
flight while the other side computes (DualPipe's pair, Megatron-Core's "combined 1F1B a2a overlap").

A layer splits into parts (DeepSeek calls them chunks; here "chunk" is already a pipeline model chunk):

    kind    forward parts                        backward parts (B = input grads, W = weight grads)
    moe     ATTN  MLP  COMBINE                   COMBINE  MLP  MLP_W  ATTN  ATTN_W
    dense   ATTN  MLP                            MLP  MLP_W  ATTN  ATTN_W
    embed   ATTN (the embedding)                 ATTN  ATTN_W
    head    ATTN (norm, lm head, loss)           ATTN  ATTN_W

and an MoE layer's four all-to-alls sit between its parts: forward ATTN (norm, attention, router) ends by
issuing DISPATCH(F) which MLP (experts) waits, MLP ends by issuing COMBINE(F) which COMBINE (weighted sum,
residual) waits; backward COMBINE (combine dX) issues COMBINE(B) which MLP (experts dX) waits, MLP issues
DISPATCH(B) which ATTN (router, norm and attention dX) waits. MLP_W and ATTN_W are the weight grads, split
from the input grads as in zero-bubble, so they can be placed where a transfer needs cover.

`pair_order` plans the merge of the two sides' parts on part costs (a list schedule, its docstring): the
part that can start first runs, a part that issues an all-to-all before one that does not, the weight grads
as filler. With unit costs (ATTN = MLP = A2A = 1, COMBINE 0) in the steady state of two MoE layers it gives
DeepSeek's picture, each transfer under the other side's compute:

    B COMBINE   L1  issues COMBINE(B)  (0 long: the first transfer starts at once)
    F ATTN      L0  under COMBINE(B); issues DISPATCH(F)
    B MLP       L1  waits COMBINE(B); under DISPATCH(F); issues DISPATCH(B)
    F MLP       L0  waits DISPATCH(F); under DISPATCH(B); issues COMBINE(F)
    B ATTN      L1  waits DISPATCH(B); under COMBINE(F)
    B COMBINE   L0  issues COMBINE(B)
    F COMBINE   L0  waits COMBINE(F)
    F ATTN      L1  under COMBINE(B); issues DISPATCH(F) ... and so on for L1 / L0
    B MLP_W, ATTN_W of both layers last: under the backward's pipeline send

(simulated: 12 instead of 20 one side after the other, every all-to-all hidden; the earlier rule-based
order took 14 and left 25% exposed). At run time kernels/pp/parts.py's run_pair also pulls the order's
weight-grad parts forward where a real transfer is later than planned.
and every OrderedPart it returns says what it hides. Dense, embedding and head layers have no all-to-all
and fill in where they stand.
The pair model is written once here: `TwoStreams`, one compute stream and one comm stream, on which
`pair_order` plans and `run_parts` replays an order (planning/pipeline/part_costs.py prices chunks with it).
Torch-free: the executor (kernels/pp/executor.py) and the simulator (planning/pipeline/simulate.py) both read it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from planning.intervals import intersect, length, merge

LAYER_KINDS = ("moe", "dense", "embed", "head")
FORWARD_PARTS = {"moe": ("ATTN", "MLP", "COMBINE"), "dense": ("ATTN", "MLP"), "embed": ("ATTN",),
                 "head": ("ATTN",)}
BACKWARD_PARTS = {"moe": ("COMBINE", "MLP", "MLP_W", "ATTN", "ATTN_W"),
                  "dense": ("MLP", "MLP_W", "ATTN", "ATTN_W"), "embed": ("ATTN", "ATTN_W"),
                  "head": ("ATTN", "ATTN_W")}
# the all-to-all an MoE part issues at its end, and the one it waits for before it starts, per side
ISSUES = {("F", "ATTN"): "DISPATCH", ("F", "MLP"): "COMBINE", ("B", "COMBINE"): "COMBINE",
          ("B", "MLP"): "DISPATCH"}
WAITS = {("F", "MLP"): "DISPATCH", ("F", "COMBINE"): "COMBINE", ("B", "MLP"): "COMBINE",
         ("B", "ATTN"): "DISPATCH"}


@dataclass(frozen=True)
class OrderedPart:
    side: str     # "F": the forward microbatch's part, "B": the backward microbatch's
    layer: int    # position of the layer in its side's order (forward: model order; backward: reversed)
    part: str     # one of FORWARD_PARTS / BACKWARD_PARTS of that layer's kind
    hides: str    # the all-to-alls in flight while it computes, e.g. "DISPATCH(F) L0, COMBINE(B) L1"
    name: str = ""  # the layer's name (L3, EMBED, HEAD; by default L + its position in model order)
    kind: str = "moe"  # the layer's kind, one of LAYER_KINDS: what the part costs and whether it moves rows

    @property
    def weight(self) -> bool:
        return self.part.endswith("_W")

    @property
    def issues(self) -> str | None:
        """The all-to-all this part issues at its end (None unless an MoE layer's)."""
        return ISSUES.get((self.side, self.part)) if self.kind == "moe" else None

    @property
    def waits(self) -> str | None:
        """The all-to-all this part waits for before it starts (None unless an MoE layer's)."""
        return WAITS.get((self.side, self.part)) if self.kind == "moe" else None


def _side_parts(side: str, kinds: list[str]) -> list[tuple[int, str, str]]:
    """(layer position, kind, part) of one side in its own order."""
    layers = list(kinds) if side == "F" else list(reversed(kinds))
    table = FORWARD_PARTS if side == "F" else BACKWARD_PARTS
    return [(k, kind, part) for k, kind in enumerate(layers) for part in table[kind]]


def _moe_issue(side: str, item) -> bool:
    return item is not None and item[1] == "moe" and (side, item[2]) in ISSUES


A2A_KEYS = ("A2A_DISPATCH_F", "A2A_COMBINE_F", "A2A_COMBINE_B", "A2A_DISPATCH_B")   # each all-to-all's own
PART_KEYS = ("ATTN", "MLP", "COMBINE", "A2A", "ATTN_B", "MLP_B", "ATTN_W", "MLP_W", *A2A_KEYS, "layers")


@dataclass(frozen=True)
class PartCost:
    """Part costs of one MoE layer. Backward input grads (ATTN_B, MLP_B) and weight grads (ATTN_W, MLP_W)
    default to the forward's (zero-bubble's B = 2F, W = F); COMBINE (a weighted sum, and its backward)
    defaults to 0; A2A is one all-to-all, and A2A_DISPATCH_F / A2A_COMBINE_F / A2A_COMBINE_B / A2A_DISPATCH_B
    each kind's own where it differs (a trace measures four: DeepSeek's combine(F) runs ~1.6x its
    combine(B)). The defaults, ATTN = MLP = A2A = 1, are the unit costs."""
    ATTN: float = 1.0
    MLP: float = 1.0
    COMBINE: float = 0.0
    A2A: float = 1.0
    ATTN_B: float | None = None     # None: ATTN
    MLP_B: float | None = None      # None: MLP
    ATTN_W: float | None = None     # None: ATTN
    MLP_W: float | None = None      # None: MLP
    A2A_DISPATCH_F: float | None = None   # None: A2A (the forward's dispatch)
    A2A_COMBINE_F: float | None = None
    A2A_COMBINE_B: float | None = None
    A2A_DISPATCH_B: float | None = None
    layers: int = 1                 # MoE layers in one model chunk
    # the embedding's parts ~ 0; the head's (norm, lm head, loss) one unit: fixed, as chunks are priced on MoE layers
    EMBED: ClassVar[float] = 0.0
    HEAD: ClassVar[float] = 1.0

    def __post_init__(self):
        for k in PART_KEYS:
            v = getattr(self, k)
            if v is not None and v < 0:
                raise ValueError(f"part cost {k} must be >= 0, got {v}")
        if self.layers < 1 or int(self.layers) != self.layers:
            raise ValueError(f"part cost layers must be a whole number >= 1, got {self.layers}")

    def of(self, side: str, part: str, kind: str = "moe") -> float:
        """Compute time of one part: side F or B, part as the tables name it (ATTN, MLP_W ...), of a layer of
        `kind` (an embedding's or a head's parts cost EMBED / HEAD)."""
        if kind in ("embed", "head"):
            return self.EMBED if kind == "embed" else self.HEAD
        if side == "F":
            return {"ATTN": self.ATTN, "MLP": self.MLP, "COMBINE": self.COMBINE}[part]
        pick = {"ATTN": self.ATTN_B, "MLP": self.MLP_B, "ATTN_W": self.ATTN_W, "MLP_W": self.MLP_W}
        if part == "COMBINE":
            return self.COMBINE
        base = self.ATTN if part.startswith("ATTN") else self.MLP
        return base if pick[part] is None else pick[part]

    def a2a(self, side: str, kind: str) -> float:
        """One all-to-all's time: `kind` DISPATCH or COMBINE, issued by side F or B; its own cost where
        given, else A2A."""
        own = getattr(self, f"A2A_{kind}_{side}")
        return self.A2A if own is None else own


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


class TwoStreams:
    """The pair model, its one clock: a part starts when the compute stream is free and the all-to-all it
    waits for has landed, and takes cost.of; an MoE part's all-to-all starts at the part's end once the comm
    stream is free, and takes cost.a2a (that kind's own cost). `timeline` holds what ran."""

    def __init__(self, cost: PartCost):
        self.cost, self.timeline = cost, PartTimeline()
        self.compute_free = self.comm_free = 0.0
        self.landed: dict = {}                   # (side, layer, a2a) -> time its rows are in place

    def start(self, p: OrderedPart) -> float:
        """When part p could start now."""
        need = p.waits
        return max(self.compute_free, self.landed.get((p.side, p.layer, need), 0.0)) if need else self.compute_free

    def run(self, p: OrderedPart) -> None:
        start = self.start(p)
        self.compute_free = end = start + self.cost.of(p.side, p.part, p.kind)
        self.timeline.compute.append((start, end, f"{p.side} {p.part} {p.name}", p.hides))
        if p.issues:
            begin = max(end, self.comm_free)
            self.comm_free = begin + self.cost.a2a(p.side, p.issues)
            self.landed[(p.side, p.layer, p.issues)] = self.comm_free
            self.timeline.comm.append((begin, self.comm_free, f"{p.issues}({p.side}) {p.name}", ""))


def run_parts(order: list[OrderedPart], cost: PartCost) -> PartTimeline:
    """Replay parts in order on the two streams (TwoStreams): compute serial, each all-to-all after its part."""
    streams = TwoStreams(cost)
    for p in order:
        streams.run(p)
    return streams.timeline


def _next_issue(parts: list, side: str, start: float, cost: PartCost) -> tuple[int, float]:
    """(0, when this side's next all-to-all would be issued) if it comes before the side's next wait, from
    `start`; else (1, 0): no transfer to feed soon."""
    t = start
    for i, (k, kind, part) in enumerate(parts):
        if i and kind == "moe" and (side, part) in WAITS:
            break
        t += cost.of(side, part, kind)
        if _moe_issue(side, (k, kind, part)):
            return 0, t
    return 1, 0.0


def pair_order(forward_kinds: list[str], backward_kinds: list[str], forward_names: list[str] | None = None,
               backward_names: list[str] | None = None, cost: PartCost = PartCost()) -> list[OrderedPart]:
    """Every part of one overlapped pair in the order it runs. forward_kinds: the forward chunk's layer kinds
    in model order; backward_kinds: the backward chunk's, in model order too (its parts run reversed);
    the names (model order, default L0, L1 ... by position) label the layers in `hides`.

    The order is planned on the pair model (TwoStreams, which run_parts replays it on) priced by `cost`
    (default the unit costs). Each side keeps its own order of input parts; a weight-grad part
    (MLP_W, ATTN_W) may run any time after its input-grad part. At each step the part that can start first
    runs; on a tie:
      1. a part that issues an all-to-all, the one whose transfer starts first (the forward on a tie): comm
         never idles while a part could feed it;
      2. then an input part (a weight grad is filler: it runs only where every input part would wait for its
         all-to-all, the rest after the last input part, under the backward's own pipeline send);
      3. then the forward.
    A part that waits for an all-to-all is held back until a part of the other microbatch ran since that
    all-to-all was issued (while the other side has an input part left): every transfer flies under the
    other side's compute, not only its own side's filler."""
    for kind in (*forward_kinds, *backward_kinds):
        if kind not in LAYER_KINDS:
            raise ValueError(f"unknown layer kind {kind!r}: pick one of {', '.join(LAYER_KINDS)}")
    todo = {"F": _side_parts("F", forward_kinds),
            "B": [p for p in _side_parts("B", backward_kinds) if not p[2].endswith("_W")]}
    weights = {(k, part[:-2]): (k, kind, part) for k, kind, part in _side_parts("B", backward_kinds)
               if part.endswith("_W")}                      # (layer, input part) -> its weight-grad part
    pool: list = []                                         # weight-grad parts whose input grad ran
    names = {"F": list(forward_names or [f"L{k}" for k in range(len(forward_kinds))]),
             "B": list(reversed(backward_names or [f"L{k}" for k in range(len(backward_kinds))]))}
    in_flight: list[str] = []                   # "DISPATCH(F) L0": issued, not yet waited
    covered: dict = {}                          # (side, layer, a2a) -> a part of the other side ran since issue
    streams = TwoStreams(cost)
    out: list[OrderedPart] = []

    def as_part(side, item, hides=""):
        k, kind, part = item
        return OrderedPart(side, k, part, hides, names[side][k], kind)

    def candidates(strict: bool):
        got = []
        for side in "FB":
            if not todo[side]:
                continue
            nxt = as_part(side, todo[side][0])
            other = todo["B" if side == "F" else "F"] or (side == "F" and pool)
            if strict and nxt.waits and not covered[(side, nxt.layer, nxt.waits)] and other:
                continue                            # nothing of the other microbatch under it yet
            start = streams.start(nxt)
            got.append(((start, *_next_issue(todo[side], side, start, cost), side != "F"), side, todo[side][0]))
        if pool:
            got.append(((streams.compute_free, 2, 0, True), "B", pool[0]))
        return got

    while todo["F"] or todo["B"] or pool:
        _, side, item = min(candidates(True) or candidates(False), key=lambda c: c[0])
        if item in pool:
            pool.remove(item)
        else:
            todo[side].pop(0)
        p = as_part(side, item)
        if p.waits:
            in_flight.remove(f"{p.waits}({side}) {p.name}")
        p = as_part(side, item, ", ".join(in_flight))
        out.append(p)
        streams.run(p)
        for other in covered:
            if other[0] != side:
                covered[other] = True
        if side == "B" and (p.layer, p.part) in weights:
            pool.append(weights[(p.layer, p.part)])
        if p.issues:
            covered[(side, p.layer, p.issues)] = False
            in_flight.append(f"{p.issues}({side}) {p.name}")
    return out


def serial_order(side: str, kinds: list[str]) -> list[OrderedPart]:
    """One side alone, part after part (a plain F or BW action): what the pair is compared against."""
    n = len(kinds)
    return [OrderedPart(side, k, part, "", f"L{k if side == 'F' else n - 1 - k}", kind)
            for k, kind, part in _side_parts(side, kinds)]
