"""Two microbatches interleaved layer by layer so one's all-to-all is in flight while the other
computes (the DeepSeek-V3 / DeepEP two-batch overlap, without a pipeline).

Per MoE block a microbatch has three phases forward, A (attention, router, dispatch issued),
X (experts, combine issued), C (combine, residual), and three backward, BC (combine dX, issued),
BX (experts dX issued, then experts dW under it), BD (router, norm and attention dX and dW).
The order for microbatches 0 and 1 through a block is

    forward:   C0' A0  C1' A1  X0  X1        (C' is the previous block's combine)
    backward:  BD0' BC0 BD1' BC1 BX0 BX1     (BD' is the next block's dispatch backward)

so 0's dispatch flies during 1's attention, 1's dispatch during 0's experts, 0's combine during
1's experts, and 1's combine during 0's next attention; backward the same, mirrored. After the
last block: C0 head0 BC0 C1 head1 BC1, so 1's last combine flies under 0's head and 0's combine
grads under 1's head. Waits happen outside the compute spans, so those spans are compute only.
The ep group's ops are posted by the comm thread (kernels/comm/poster.py) and uneven
dispatch exchanges its counts as soon as routing knows them (MoE.early_counts).

What this order can hide at best, per MoE block, with d one half-batch all-to-all (issue to
completion on the link), A = C + attention + router of one microbatch, X its experts forward,
Bd its BD + BC, Xd / Xw its experts dX / dW (each a2a can only fly under the other microbatch's
compute between its issue and its wait):

    forward exposed  = 2 max(0, d - A) + 2 max(0, d - X)          (disp0, comb1 | disp1, comb0)
    backward exposed = max(0, d - Bd) + max(0, d - Xd - Xw)         (bc0 | bc1)
                       + max(0, d - Xw - Xd - Xw) + max(0, d - Xw - Bd)   (bx0 | bx1)

out of 8d; the last block's comb1 / bc0 fly under a head instead of A / Bd. So with d <= min(A,
X) every all-to-all is hidden and only the count exchanges beyond the rows' build time, two ops
sharing the link and waits on a slower peer stay exposed; the step saves all a2a time less what
the two halves cost over one whole batch (compute_ms of `partui bench ep`, on against off).
"""
from __future__ import annotations

from contextlib import contextmanager

from kernels.comm import events
from kernels.ep.layer import overlap_all_to_alls
from kernels.model import Block
from kernels.runners.microbatch import MicrobatchRunner
from kernels.straggle import stretch


def _split_block(layer) -> bool:
    return isinstance(layer, Block) and getattr(layer.mlp, "is_moe", False)


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
        xs, ts = ids.chunk(pieces), targets.chunk(pieces)
        for p in range(0, pieces, 2):
            loss = loss + self._pair(xs[p:p + 2], ts[p:p + 2], (p, p + 1), denom, hooks)
        return loss

    # ---------------------------------------------------------------- one pair of microbatches
    def _pair(self, ids, targets, mbs, denom, hooks):
        body, head = self.layers[:-1], self.layers[-1]
        xs, pending = list(ids), [None, None]
        ctxs = [[], []]
        for layer in body:
            hooks and hooks.before_forward(layer)
            split = _split_block(layer)
            for i in (0, 1):
                if pending[i] is not None:
                    xs[i] = self._fc(*pending[i], ctxs[i], mbs[i])
                    pending[i] = None
                if split:
                    pending[i] = (layer, self._fa(layer, xs[i], mbs[i]))
                else:
                    with self._compute(f"F layer mb{mbs[i]}", "F", mb=mbs[i]):
                        xs[i], c = layer.forward(xs[i])
                    ctxs[i].append(c)
            if split:
                for i in (0, 1):
                    c_m = pending[i][1].dispatch
                    layer.mlp.wait(c_m)
                    with self._compute(f"experts L{layer.index} mb{mbs[i]}", "expert",
                                       layer=layer.index, mb=mbs[i]):
                        layer.mlp.forward_experts(c_m)   # issues the combine at its end
            hooks and hooks.after_forward(layer)
        # the last block's combine of 1 flies under 0's head; 0's combine grads under 1's head
        last = body[-1] if body else None
        early_bc = pending[0] is not None     # the last block is split (an MoE block)
        loss, dxs = 0.0, [None, None]
        hooks and hooks.before_forward(head)
        for i in (0, 1):
            if pending[i] is not None:
                xs[i] = self._fc(*pending[i], ctxs[i], mbs[i])
            with self._compute(f"head mb{mbs[i]}", "loss", mb=mbs[i]):
                part, c_head = head.forward(xs[i], targets[i], denom)
                dxs[i] = head.backward_input(c_head)
                head.backward_weight(c_head)
            loss = loss + part + sum((getattr(c, "aux_loss", 0.0) for c in ctxs[i]), 0.0)
            if early_bc:
                if i == 0:
                    hooks and hooks.before_backward(last)
                self._bc(last, ctxs[i][-1], dxs[i], mbs[i])
        hooks and hooks.after_backward(head)
        self._backward(body, ctxs, dxs, mbs, hooks, early_bc)
        return loss

    def _fa(self, blk, x, mb):
        """A: attention branch, norm, router; the dispatch all-to-all is issued at the end."""
        with self._compute(f"attn+router L{blk.index} mb{mb}", "F", layer=blk.index, mb=mb):
            h, e2, st = blk.forward_to_mlp(x)
            st.h, st.dispatch = h, blk.mlp.forward_dispatch(e2)
        return st

    def _fc(self, blk, st, ctxs, mb):
        """C: wait for the combine, weighted sum and residual; the block ctx Block expects."""
        blk.mlp.wait(st.dispatch)
        with self._compute(f"combine L{blk.index} mb{mb}", "F", layer=blk.index, mb=mb):
            m, c_m = blk.mlp.forward_combine(st.dispatch)
            h = st.h
            del st.h, st.dispatch  # the rest of st is the block ctx backward_input expects
            y, ctx = blk.finish_forward(h, m, c_m, st)
        ctxs.append(ctx)
        return y

    # ---------------------------------------------------------------- backward, mirrored
    def _backward(self, body, ctxs, dxs, mbs, hooks, bc_done: bool = False):
        """bc_done: the last block's BC phases already ran (under the heads)."""
        pending = [None, None]            # (block, ctx, dy) waiting for its BD phase
        for k, layer in enumerate(reversed(body)):
            early = bc_done and k == 0
            if not early:
                hooks and hooks.before_backward(layer)
            split = _split_block(layer)
            for i in (0, 1):
                c = ctxs[i].pop()
                if pending[i] is not None:
                    dxs[i] = self._bd(*pending[i], mbs[i])
                    if i == 1:
                        hooks and hooks.after_backward(pending[i][0])
                    pending[i] = None
                if split:
                    if not early:
                        self._bc(layer, c, dxs[i], mbs[i])
                    pending[i] = (layer, c, dxs[i])
                else:
                    with self._compute(f"B layer mb{mbs[i]}", "B", mb=mbs[i]):
                        dxs[i] = layer.backward_input(c, dxs[i])
                        layer.backward_weight(c)
            if split:
                for i in (0, 1):
                    c_m = pending[i][1].c_m
                    layer.mlp.wait(c_m)
                    with self._compute(f"experts dX+dW L{layer.index} mb{mbs[i]}", "expert",
                                       layer=layer.index, mb=mbs[i]):
                        layer.mlp.backward_experts(c_m)          # issues the dX all-to-all
                        layer.mlp.backward_expert_weights(c_m)   # computed under it
            else:
                hooks and hooks.after_backward(layer)
        for i in (0, 1):
            if pending[i] is not None:
                dxs[i] = self._bd(*pending[i], mbs[i])
        if pending[1] is not None:
            hooks and hooks.after_backward(pending[1][0])

    def _bc(self, blk, c, dy, mb):
        """BC: combine backward; the all-to-all of the expert-output grads is issued."""
        with self._compute(f"combine dX L{blk.index} mb{mb}", "B", layer=blk.index, mb=mb):
            dm = blk.exit_mlp.backward(c.c_x2, dy)
            blk.mlp.backward_combine(c.c_m, dm)

    def _bd(self, blk, c, dy, mb):
        """BD: router / dispatch backward, then the norm and attention branch, dX and dW."""
        blk.mlp.wait(c.c_m)
        with self._compute(f"router+attn dX dW L{blk.index} mb{mb}", "B", layer=blk.index, mb=mb):
            dm = blk.mlp.backward_dispatch(c.c_m)
            dm = blk.enter_mlp.backward(c.c_e2, dm)
            dh = dy + blk.mlp_norm.backward_input(c.c_n2, dm)
            da = blk.exit_attn.backward(c.c_x1, dh)
            da = blk.attn.backward_input(c.c_a, da)
            da = blk.enter_attn.backward(c.c_e1, da)
            dx = dh + blk.attn_norm.backward_input(c.c_n1, da)
            blk.mlp.backward_router_weight(c.c_m)
            blk.mlp_norm.backward_weight(c.c_n2)
            blk.attn.backward_weight(c.c_a)
            blk.attn_norm.backward_weight(c.c_n1)
        return dx
