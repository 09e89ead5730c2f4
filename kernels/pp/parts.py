"""A pipeline chunk's forward and backward cut into DeepSeek's parts (planning/pipeline/fb_order.py names them), as
closures the executor runs in an overlapped F&B pair's order.

Each Part waits for the all-to-all it consumes with `wait()` (blocked time, kept out of compute spans) and then
computes with `run()`; an MoE part's run ends by issuing its next all-to-all (kernels/ep/layer.py's phases).
The math is the layers' own, regrouped: a Block's backward parts are kernels/block.py's (the ones
`Block.backward_input` + `backward_weight` run back to back), so a pair's grads equal the plain executor's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kernels.block import Block
from kernels.comm import events
from kernels.layers.base import Ctx
from kernels.model import Embed, Head
from planning.pipeline.fb_order import pair_order


def layer_kind(layer) -> str:
    """moe, dense, embed or head: which parts the layer splits into."""
    if isinstance(layer, Embed):
        return "embed"
    if isinstance(layer, Head):
        return "head"
    if isinstance(layer, Block):
        return "moe" if layer.is_moe else "dense"
    raise TypeError(f"no parts for layer {type(layer).__name__}: expected Embed, Block or Head")


def pair_layer_name(layer) -> str:
    """The name a layer goes by in an F&B pair's order and its part spans: L3, EMBED or HEAD."""
    return f"L{layer.index}" if isinstance(layer, Block) else layer_kind(layer).upper()


@dataclass
class Part:
    name: str                   # ATTN, MLP, COMBINE, MLP_W, ATTN_W
    layer: object
    run: Callable[[], None]
    wait: Callable[[], None] = lambda: None
    ready: Callable[[], bool] = lambda: True     # its all-to-all has landed (wait() would not block)


def landed(c) -> bool:
    """An MoE phase context's pending all-to-all (kernels/ep/layer.py's c.pending) has landed: none is
    pending, a group of one moved nothing, or its handle says so (on an emulated link, at the modelled end)."""
    pending = getattr(c, "pending", None)
    return pending is None or not hasattr(pending, "is_completed") or pending.is_completed()


class ForwardParts:
    """The forward of one microbatch through a chunk; parts(k) are layer k's. After the last: result()."""

    def __init__(self, chunk, x, targets, denom, hooks):
        self.layers, self.targets, self.denom, self.hooks = chunk.layers, targets, denom, hooks
        self.x, self.ctxs, self.aux = x, [], 0.0          # x [b, s, dim] (ids [b, s] on the first stage)

    def parts(self, k: int) -> list[Part]:
        layer, hooks = self.layers[k], self.hooks
        kind = layer_kind(layer)
        st = Ctx()

        def whole():
            hooks.before_forward(layer)
            if kind == "head":
                self.x, c = layer.forward(self.x, self.targets, self.denom)   # the partial loss
            else:
                self.x, c = layer.forward(self.x)
            self.ctxs.append(c)
            hooks.after_forward(layer)

        def attn():
            hooks.before_forward(layer)
            st.h, e2, st.ctx = layer.forward_to_mlp(self.x)                 # norm, attention, norm
            if kind == "moe":
                st.c_m = layer.mlp.forward_dispatch(e2)                      # router; issues DISPATCH
            else:
                st.e2 = e2

        def mlp():
            if kind == "moe":
                layer.mlp.forward_experts(st.c_m)                            # issues COMBINE
            else:
                m, c_m = layer.mlp.forward(st.e2)
                self._finish(layer, st, m, c_m)

        def combine():
            m, c_m = layer.mlp.forward_combine(st.c_m)
            self._finish(layer, st, m, c_m)

        if kind in ("embed", "head"):
            return [Part("ATTN", layer, whole)]
        out = [Part("ATTN", layer, attn), Part("MLP", layer, mlp)]
        if kind == "moe":
            out[1].wait = lambda: layer.mlp.wait(st.c_m)
            out[1].ready = lambda: landed(st.c_m)
            out.append(Part("COMBINE", layer, combine, lambda: layer.mlp.wait(st.c_m), lambda: landed(st.c_m)))
        return out

    def _finish(self, layer, st, m, c_m) -> None:
        self.x, c = layer.finish_forward(st.h, m, c_m, st.ctx)              # residual; the block's ctx
        self.ctxs.append(c)
        self.aux = self.aux + c.aux_loss                                     # MoE aux loss (0 for dense)
        self.hooks.after_forward(layer)

    def result(self):
        """(output, or the partial loss on the last stage; ctxs; aux loss), as forward_steps returns."""
        return self.x, self.ctxs, self.aux


class BackwardParts:
    """The full backward of one microbatch through a chunk, input and weight grads apart; parts(k) are those
    of the k-th layer from the end. dx (None on the first stage) is ready once every non-W part ran."""

    def __init__(self, chunk, ctxs: list, dy, hooks):
        self.layers, self.ctxs, self.hooks = list(reversed(chunk.layers)), list(reversed(ctxs)), hooks
        self.dx = dy                                       # None on the last stage: the head starts from 1

    def parts(self, k: int) -> list[Part]:
        layer, c, hooks = self.layers[k], self.ctxs[k], self.hooks
        kind = layer_kind(layer)
        st = Ctx()

        def whole_b():
            hooks.before_backward(layer)
            self.dx = layer.backward_input(c) if kind == "head" else layer.backward_input(c, self.dx)

        def whole_w():
            layer.backward_weight(c)
            hooks.after_backward(layer)

        def combine():                                      # MoE: combine dX; issues COMBINE(B)
            hooks.before_backward(layer)
            st.dy = self.dx
            layer.backward_combine(c, st.dy)

        def mlp():
            if kind == "moe":
                layer.mlp.backward_experts(c.c_m)           # experts dX; issues DISPATCH(B)
            else:
                hooks.before_backward(layer)
                st.dy = self.dx
                st.dm = layer.backward_mlp(c, st.dy)

        def attn():
            dm = layer.mlp.backward_dispatch(c.c_m) if kind == "moe" else st.dm   # at the MLP's input
            self.dx = layer.backward_attention(c, st.dy, dm)

        def attn_w():
            layer.backward_attention_weight(c)
            hooks.after_backward(layer)

        if kind in ("embed", "head"):
            return [Part("ATTN", layer, whole_b), Part("ATTN_W", layer, whole_w)]
        out = [Part("MLP", layer, mlp), Part("MLP_W", layer, lambda: layer.backward_mlp_weight(c)),
               Part("ATTN", layer, attn), Part("ATTN_W", layer, attn_w)]
        if kind == "moe":
            out[0].wait = out[2].wait = lambda: layer.mlp.wait(c.c_m)
            out[0].ready = out[2].ready = lambda: landed(c.c_m)
            out.insert(0, Part("COMBINE", layer, combine))
        return out


def chunk_pair_order(fch, bch) -> list:
    """planning.pipeline.fb_order.pair_order for a forward chunk and a backward chunk of this rank."""
    f, b = fch.layers, bch.layers
    return pair_order([layer_kind(x) for x in f], [layer_kind(x) for x in b], [pair_layer_name(x) for x in f],
                      [pair_layer_name(x) for x in b])


def run_part(step, part: Part, args: dict, hides: str) -> None:
    """One part as a leaf compute span: "ATTN F mb3 L1", cat F / B / W, args mb, chunk, stage, part, hides."""
    kind = "W" if step.weight else step.side
    with events.span(f"{step.part.removesuffix('_W')} {kind} mb{args['mb']} {step.name}", kind,
                     part=step.part, hides=hides, **args):
        part.run()


def run_carried(carry: list, hides: str = "") -> None:
    """Run (and empty) the weight-grad parts an earlier pair left in `carry`, oldest first."""
    while carry:
        step, part, args = carry.pop(0)
        run_part(step, part, args, hides or step.hides)


def run_pair(order: list, fwd: ForwardParts, bwd: BackwardParts, args: dict, forward_done, backward_done,
             fill: bool = True, carry: list | None = None) -> None:
    """Run a pair's parts in `order`, each a leaf compute span (run_part) after its all-to-all wait.
    forward_done() runs after the forward's last part, backward_done() after the backward's last input-grad
    part: the pipeline sends ride under the parts still to run.

    fill: where a part is about to wait for an all-to-all that has not landed, weight-grad parts run first
    until it lands: those an earlier pair left in `carry`, then those the order puts later (in the order's
    own sequence, each once its input grad ran). The order was planned on model costs; the real transfer may
    be longer, or the ep peer later. W parts issue no all-to-all and keep their relative order, so every
    rank still issues its collectives (the all-to-alls, and the grad sync hooks fire from ATTN_W) in the
    same sequence. Such a part's `hides` reads "filler: <the transfer>".
    carry (a list the executor keeps, or None): the W parts after the pair's last input part are not run
    here but left in it for the next pair's waits; what an earlier pair left and no wait took runs at the
    end of this one, so at most one pair's W parts are ever carried."""
    last = {side: max(i for i, p in enumerate(order) if p.side == side and not p.weight) for side in "FB"}
    built = {"F": {}, "B": {}}                    # side -> layer position -> {part name: Part}
    ran: set = set()                              # positions in `order` already run (fillers)
    done: set = set()                             # (side, layer, part) run
    weights = [i for i, p in enumerate(order) if p.weight]
    tail = max(last.values())                     # W parts after this are carried (with a carry list)
    older = list(carry) if carry is not None else []
    if carry is not None:
        carry.clear()

    def get(step):
        side = fwd if step.side == "F" else bwd
        return built[step.side].setdefault(step.layer, {p.name: p for p in side.parts(step.layer)})

    def execute(i, step, part, hides):
        ran.add(i)
        done.add((step.side, step.layer, step.part))
        run_part(step, part, args[step.side], hides)

    for i, step in enumerate(order):
        if i in ran:
            continue
        part = get(step).pop(step.part)
        if carry is not None and step.weight and i > tail:
            carry.append((step, part, args[step.side]))
            continue
        if step.weight:
            run_carried(older)                     # an earlier pair's W first: the hooks keep their order
        if fill and step.waits and not part.ready():
            label = f"filler: {step.waits}({step.side}) {step.name}"
            while older and not part.ready():
                w_step, w_part, w_args = older.pop(0)
                run_part(w_step, w_part, w_args, label)
            for j in [j for j in weights if j > i and j not in ran]:
                w = order[j]
                if ("B", w.layer, w.part[:-2]) not in done or part.ready():
                    break                          # its input grad has not run, or the transfer landed
                execute(j, w, get(w).pop(w.part), label)
        part.wait()                                # blocked on its all-to-all: not compute
        execute(i, step, part, step.hides)
        if i == last["F"]:
            forward_done()
        if i == last["B"]:
            backward_done()
        if i == tail:
            run_carried(older)                     # an earlier pair's W no wait took: under the sends
