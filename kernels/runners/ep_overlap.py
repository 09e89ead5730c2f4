"""Two microbatches interleaved layer by layer so one's all-to-all is in flight while the other
computes (the DeepSeek-V3 / DeepEP two-batch overlap, without a pipeline).

Each MoE block runs cut into DeepSeek's parts (planning/pipeline/fb_order.py; the math is
kernels/block.py's): forward ATTN (attention, router; issues DISPATCH), MLP (experts; issues
COMBINE), COMBINE (weighted sum, residual); backward COMBINE (combine dX; issues COMBINE(B)), MLP
(experts dX; issues DISPATCH(B)) with MLP_W (experts dW) under it, ATTN (router, norm and attention
dX) with ATTN_W. The order for microbatches 0 and 1 through a block is

    forward:   COMBINE0' ATTN0  COMBINE1' ATTN1  MLP0  MLP1     (COMBINE': the previous block's)
    backward:  ATTN0'  COMBINE0  ATTN1'  COMBINE1  MLP0  MLP1   (ATTN': the next block's)

so 0's dispatch flies during 1's attention, 1's dispatch during 0's experts, 0's combine during
1's experts, and 1's combine during 0's next attention; backward the same, mirrored. After the
last block: COMBINE0 head0 B-COMBINE0 COMBINE1 head1 B-COMBINE1, so 1's last combine flies under
0's head and 0's combine grads under 1's head. Waits happen outside the compute spans, so those
spans are compute only (their names: "attn+router", "experts", "combine", "combine dX",
"experts dX+dW", "router+attn dX dW", each with L<layer> mb<microbatch>).
The ep group's ops are posted by the comm thread (kernels/comm/poster.py) and uneven
dispatch exchanges its counts as soon as routing knows them (MoE.early_counts).

What this order can hide at best, per MoE block, with d one half-batch all-to-all (issue to
completion on the link) and each part's time for one microbatch (ATTN counting the previous
block's forward COMBINE, ATTN_B the backward COMBINE, ATTN's input and weight grads; MLP_B / MLP_W
the experts' dX / dW; an all-to-all can only fly under the other microbatch's compute between its
issue and its wait):

    forward exposed  = 2 max(0, d - ATTN) + 2 max(0, d - MLP)       (DISPATCH0, COMBINE1 | DISPATCH1, COMBINE0)
    backward exposed = max(0, d - ATTN_B) + max(0, d - MLP_B - MLP_W)           (COMBINE(B)0 | 1)
                       + max(0, d - MLP_W - MLP_B - MLP_W) + max(0, d - MLP_W - ATTN_B)   (DISPATCH(B)0 | 1)

out of 8d; the last block's COMBINE1 / COMBINE(B)0 fly under a head instead. So with d <=
min(ATTN, MLP) every all-to-all is hidden and only the count exchanges beyond the rows' build
time, two ops sharing the link and waits on a slower peer stay exposed; the step saves all a2a time
less what the two halves cost over one whole batch (compute_ms of `partui bench ep`, on against off).
"""
from __future__ import annotations

from contextlib import contextmanager

from kernels.block import Block
from kernels.comm import events
from kernels.ep.layer import overlap_all_to_alls
from kernels.memory import account_of
from kernels.runners.microbatch import MicrobatchRunner
from kernels.straggle import stretch


def _split_block(layer) -> bool:
    return isinstance(layer, Block) and layer.is_moe


class OverlapRunner(MicrobatchRunner):
    """Same params / loss ownership as the plain runner; a different order of the same math."""

    def __init__(self, ctx, layers: list, backward: str):
        super().__init__(ctx, layers, backward)
        if backward != "hand":
            raise ValueError("overlap interleaves hand-written backward phases: run with "
                             "backward=hand")
        m, n = ctx.plan.microbatches, ctx.cfg.batch // ctx.plan.dp   # per-rank sequences
        self.pieces = 2 if m == 1 else m
        if self.pieces % 2 or n % self.pieces:
            raise ValueError(f"overlap runs microbatches in pairs: per-rank batch {n} (batch "
                             f"{ctx.cfg.batch} / dp {ctx.plan.dp}) into {self.pieces} microbatches "
                             f"does not work; pick microbatches even and dividing {n}, or a "
                             f"per-rank batch of 2 or more")
        overlap_all_to_alls(layers)   # posted by the comm thread; counts fly while rows are built

    def accumulations(self) -> dict[str, int]:
        """Param name -> grad accumulations a step: one per piece (2 where the plan says 1)."""
        return dict.fromkeys(self.params(), self.pieces)

    def role(self) -> str:
        return f"all {self.ctx.cfg.layers} layers, two microbatches interleaved (EP overlap)"

    @contextmanager
    def _compute(self, name: str, cat: str, **args):
        t0 = events.now_ns()
        with events.span(name, cat, **args):
            yield
        stretch(t0, self.slow)                  # --slow-rank / --slow-stage / World.slow

    def forward_backward(self, ids, targets, denom, hooks):
        pieces = self.pieces
        loss = 0.0
        self.memory = account_of(self.ctx.stats)   # both microbatches' contexts, layer by layer
        xs, ts = ids.chunk(pieces), targets.chunk(pieces)
        for p in range(0, pieces, 2):
            loss = loss + self._pair(xs[p:p + 2], ts[p:p + 2], (p, p + 1), denom, hooks)
        return loss

    # ---------------------------------------------------------------- one pair of microbatches
    def _saved(self, mb, ctx) -> None:
        """Microbatch mb's entry grows by a layer's finished context (as the plain runner's)."""
        self.memory.stack(("overlap", mb), ctx)

    def _freed(self, mb) -> None:
        """A layer's backward of microbatch mb is done: its context goes."""
        self.memory.unstack(("overlap", mb))

    def _pair(self, ids, targets, mbs, denom, hooks):
        body, head = self.layers[:-1], self.layers[-1]
        self.memory.at(f"F+B mb{mbs[0]}+{mbs[1]} (overlap)")
        xs, pending = list(ids), [None, None]
        ctxs = [[], []]
        for layer in body:
            hooks and hooks.before_forward(layer)
            split = _split_block(layer)
            for i in (0, 1):
                if pending[i] is not None:
                    xs[i] = self._forward_combine(*pending[i], ctxs[i], mbs[i])
                    pending[i] = None
                if split:
                    pending[i] = (layer, self._forward_attn(layer, xs[i], mbs[i]))
                else:
                    with self._compute(f"F layer mb{mbs[i]}", "F", mb=mbs[i]):
                        xs[i], c = layer.forward(xs[i])
                    ctxs[i].append(c)
                    self._saved(mbs[i], c)
            if split:
                for i in (0, 1):
                    c_m = pending[i][1].dispatch
                    layer.mlp.wait(c_m)
                    with self._compute(f"experts L{layer.index} mb{mbs[i]}", "expert",
                                       layer=layer.index, mb=mbs[i]):
                        layer.mlp.forward_experts(c_m)   # F MLP: issues COMBINE at its end
            hooks and hooks.after_forward(layer)
        # the last block's combine of 1 flies under 0's head; 0's combine grads under 1's head
        last = body[-1] if body else None
        early_combine = pending[0] is not None     # the last block is split (an MoE block)
        loss, dxs = 0.0, [None, None]
        hooks and hooks.before_forward(head)
        for i in (0, 1):
            if pending[i] is not None:
                xs[i] = self._forward_combine(*pending[i], ctxs[i], mbs[i])
            with self._compute(f"head mb{mbs[i]}", "loss", mb=mbs[i]):
                part, c_head = head.forward(xs[i], targets[i], denom)
                dxs[i] = head.backward_input(c_head)
                head.backward_weight(c_head)
            loss = loss + part + sum((getattr(c, "aux_loss", 0.0) for c in ctxs[i]), 0.0)
            if early_combine:
                if i == 0:
                    hooks and hooks.before_backward(last)
                self._backward_combine(last, ctxs[i][-1], dxs[i], mbs[i])
        hooks and hooks.after_backward(head)
        self._backward(body, ctxs, dxs, mbs, hooks, early_combine)
        return loss

    def _forward_attn(self, blk, x, mb):
        """F ATTN: attention branch, norm, router; issues DISPATCH at the end."""
        with self._compute(f"attn+router L{blk.index} mb{mb}", "F", layer=blk.index, mb=mb):
            h, e2, st = blk.forward_to_mlp(x)
            st.h, st.dispatch = h, blk.mlp.forward_dispatch(e2)
        return st

    def _forward_combine(self, blk, st, ctxs, mb):
        """F COMBINE: wait for the combine, weighted sum and residual; the block ctx Block expects."""
        blk.mlp.wait(st.dispatch)
        with self._compute(f"combine L{blk.index} mb{mb}", "F", layer=blk.index, mb=mb):
            m, c_m = blk.mlp.forward_combine(st.dispatch)
            h = st.h
            del st.h, st.dispatch  # the rest of st is the block ctx backward_input expects
            y, ctx = blk.finish_forward(h, m, c_m, st)
        ctxs.append(ctx)
        self._saved(mb, ctx)
        return y

    # ---------------------------------------------------------------- backward, mirrored
    def _backward(self, body, ctxs, dxs, mbs, hooks, combine_done: bool = False):
        """combine_done: the last block's backward COMBINE parts already ran (under the heads)."""
        pending = [None, None]            # (block, ctx, dy) waiting for its backward ATTN
        for k, layer in enumerate(reversed(body)):
            early = combine_done and k == 0
            if not early:
                hooks and hooks.before_backward(layer)
            split = _split_block(layer)
            for i in (0, 1):
                c = ctxs[i].pop()
                if pending[i] is not None:
                    dxs[i] = self._backward_attn(*pending[i], mbs[i])
                    self._freed(mbs[i])
                    if i == 1:
                        hooks and hooks.after_backward(pending[i][0])
                    pending[i] = None
                if split:
                    if not early:
                        self._backward_combine(layer, c, dxs[i], mbs[i])
                    pending[i] = (layer, c, dxs[i])
                else:
                    with self._compute(f"B layer mb{mbs[i]}", "B", mb=mbs[i]):
                        dxs[i] = layer.backward_input(c, dxs[i])
                        layer.backward_weight(c)
                    self._freed(mbs[i])
            if split:
                for i in (0, 1):
                    c = pending[i][1]
                    layer.mlp.wait(c.c_m)
                    with self._compute(f"experts dX+dW L{layer.index} mb{mbs[i]}", "expert",
                                       layer=layer.index, mb=mbs[i]):
                        layer.mlp.backward_experts(c.c_m)   # B MLP: issues DISPATCH(B)
                        layer.backward_mlp_weight(c)        # MLP_W, under it
            else:
                hooks and hooks.after_backward(layer)
        for i in (0, 1):
            if pending[i] is not None:
                dxs[i] = self._backward_attn(*pending[i], mbs[i])
                self._freed(mbs[i])
        if pending[1] is not None:
            hooks and hooks.after_backward(pending[1][0])

    def _backward_combine(self, blk, c, dy, mb):
        """B COMBINE: the combine's dX; issues COMBINE(B)."""
        with self._compute(f"combine dX L{blk.index} mb{mb}", "B", layer=blk.index, mb=mb):
            blk.backward_combine(c, dy)

    def _backward_attn(self, blk, c, dy, mb):
        """B ATTN and ATTN_W: the dispatch's dX (router), the norm and attention branch; their dW."""
        blk.mlp.wait(c.c_m)
        with self._compute(f"router+attn dX dW L{blk.index} mb{mb}", "B", layer=blk.index, mb=mb):
            dx = blk.backward_attention(c, dy, blk.mlp.backward_dispatch(c.c_m))
            blk.backward_attention_weight(c)
        return dx
