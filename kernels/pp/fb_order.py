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

`pair_order` merges the two sides' parts by three rules (its docstring) so that right after a part issues
an all-to-all, a part of the other microbatch computes while it flies. In the steady state of two MoE
layers it gives DeepSeek's picture, each transfer under the other side's compute:

    F ATTN      L0  issues DISPATCH(F)
    B COMBINE   L1  under DISPATCH(F); issues COMBINE(B)
    F MLP       L0  waits DISPATCH(F); under COMBINE(B); issues COMBINE(F)
    B MLP       L1  waits COMBINE(B); under COMBINE(F); issues DISPATCH(B)
    F COMBINE   L0  waits COMBINE(F); under DISPATCH(B)
    F ATTN      L1  under DISPATCH(B); issues DISPATCH(F)
    B MLP_W     L1  under DISPATCH(B) and DISPATCH(F)
    F MLP       L1  waits DISPATCH(F); under DISPATCH(B); issues COMBINE(F)
    B ATTN      L1  waits DISPATCH(B); under COMBINE(F) ...

and every OrderedPart it returns says what it hides. Dense, embedding and head layers have no all-to-all
and fill in where they stand.
Torch-free: the executor (kernels/pp/executor.py) and the simulator (kernels/pp/simulate.py) both read it.
"""
from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def weight(self) -> bool:
        return self.part.endswith("_W")

    @property
    def issues(self) -> str | None:
        return ISSUES.get((self.side, self.part))

    @property
    def waits(self) -> str | None:
        return WAITS.get((self.side, self.part))


def _side_parts(side: str, kinds: list[str]) -> list[tuple[int, str, str]]:
    """(layer position, kind, part) of one side in its own order."""
    layers = list(kinds) if side == "F" else list(reversed(kinds))
    table = FORWARD_PARTS if side == "F" else BACKWARD_PARTS
    return [(k, kind, part) for k, kind in enumerate(layers) for part in table[kind]]


def _moe_issue(side: str, item) -> bool:
    return item is not None and item[1] == "moe" and (side, item[2]) in ISSUES


def pair_order(forward_kinds: list[str], backward_kinds: list[str], forward_names: list[str] | None = None,
               backward_names: list[str] | None = None) -> list[OrderedPart]:
    """Every part of one overlapped pair in the order it runs. forward_kinds: the forward chunk's layer kinds
    in model order; backward_kinds: the backward chunk's, in model order too (its parts run reversed);
    the names (model order, default L0, L1 ... by position) label the layers in `hides`.

    The rules, in this order of precedence:
      1. right after a part that issues an all-to-all, the other side's next part runs (that is what hides
         it); when the other side has no part left, a deferred ATTN_W of the backward runs instead;
      2. otherwise a side whose next part issues an all-to-all goes first, while the other side still has
         a part to put under it (the forward first when both do: the backward's pipeline input gets time);
      3. otherwise the sides alternate.
    The backward's MLP_W runs right before its layer's ATTN, which waits for DISPATCH(B): one more part
    under that transfer. ATTN_W is deferred: taken as cover by rule 1, the rest after the last input-grad
    part, where they run under the backward's own pipeline send."""
    for kind in (*forward_kinds, *backward_kinds):
        if kind not in LAYER_KINDS:
            raise ValueError(f"unknown layer kind {kind!r}: pick one of {', '.join(LAYER_KINDS)}")
    todo = {"F": _side_parts("F", forward_kinds),
            "B": [p for p in _side_parts("B", backward_kinds) if p[2] != "ATTN_W"]}
    deferred = [p for p in _side_parts("B", backward_kinds) if p[2] == "ATTN_W"]
    done: set = set()                            # (layer, part) of the backward run so far
    names = {"F": list(forward_names or [f"L{k}" for k in range(len(forward_kinds))]),
             "B": list(reversed(backward_names or [f"L{k}" for k in range(len(backward_kinds))]))}
    in_flight: list[str] = []                   # "DISPATCH(F) L0": issued, not yet waited
    out: list[OrderedPart] = []

    def run(side, item):
        k, kind, part = item
        if kind == "moe" and (side, part) in WAITS:
            in_flight.remove(f"{WAITS[(side, part)]}({side}) {names[side][k]}")
        out.append(OrderedPart(side, k, part, ", ".join(in_flight), names[side][k]))
        if side == "B":
            done.add((k, part))
        if kind == "moe" and (side, part) in ISSUES:
            in_flight.append(f"{ISSUES[(side, part)]}({side}) {names[side][k]}")

    prev = None                                 # (side, issued) of the last part run
    while todo["F"] or todo["B"]:
        head = {s: todo[s][0] if todo[s] else None for s in "FB"}
        if prev is not None and prev[1]:                              # rule 1
            other = "B" if prev[0] == "F" else "F"
            if head[other] is not None:
                side = other
            elif deferred and (deferred[0][0], deferred[0][2][:-2]) in done:   # its input grad ran
                k, kind, part = deferred.pop(0)
                out.append(OrderedPart("B", k, part, ", ".join(in_flight), names["B"][k]))
                prev = ("B", False)
                continue
            else:
                side = prev[0]
        else:
            issuers = [s for s in "FB" if _moe_issue(s, head[s]) and head["B" if s == "F" else "F"] is not None]
            if issuers:                                               # rule 2
                side = issuers[0]
            else:                                                     # rule 3
                side = "F" if prev is None or prev[0] == "B" else "B"
                if head[side] is None:
                    side = "B" if side == "F" else "F"
        item = todo[side].pop(0)
        run(side, item)
        prev = (side, _moe_issue(side, item))
    out += [OrderedPart("B", k, part, "", names["B"][k]) for k, _, part in deferred]
    return out


def serial_order(side: str, kinds: list[str]) -> list[OrderedPart]:
    """One side alone, part after part (a plain F or BW action): what the pair is compared against."""
    n = len(kinds)
    return [OrderedPart(side, k, part, "", f"L{k if side == 'F' else n - 1 - k}")
            for k, _, part in _side_parts(side, kinds)]
