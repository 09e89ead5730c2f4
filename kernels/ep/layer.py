"""Expert parallelism: the MoE layer with its experts sharded over the ep group, all-to-all
dispatch and combine; its expert load goes to the rank's per-step stats (kernels/ep/routing_load.py).

A forward runs in phases so kernels/runners/ep_overlap.py can put one microbatch's all-to-all in flight
while another computes:

    forward_dispatch(x)   route, build the rows, exchange counts, issue the dispatch all-to-all
    forward_experts(c)    wait for the rows, run the local experts, issue the combine all-to-all
    forward_combine(c)    wait for the outputs, weighted sum back into token order

and the backward mirrors it (backward_combine / backward_experts / backward_dispatch); the
backward of an all-to-all is the reverse all-to-all with the splits swapped.
Dispatch "uneven" sends only kept rows (counts exchanged first by an all-to-all of counts; with
`early_counts`, as the two-microbatch overlap runs it, issued as soon as routing knows them and
waited only when the rows are built, so it flies under that work);
"even" is GShard's capacity-padded buffer of equal splits, no count exchange.
The routing is the family's (`route` / `gate_backward`: GShard here, DeepSeek-V3 in
kernels/ep/deepseek_layer.py); shared experts, when a family has them, run while the dispatch
all-to-all is in flight (and their dX while the combine's grads fly), their sum added at combine.
"""
from __future__ import annotations

import torch

from kernels import comm
from kernels.comm import events
from kernels.ep.routing import (capacity, combine, combine_backward, even_rows, experts_backward_input,
                                experts_backward_weight, experts_forward, gate_backward, gather_rows,
                                group_tokens, route, scatter_rows, uneven_rows)
from kernels.ep.routing_load import ExpertLoad
from kernels.layers.base import Ctx, Layer, Param

DISPATCH_MODES = ("uneven", "even")


class _Ready:
    """A finished exchange (group of one): wait() returns the tensor."""

    def __init__(self, t):
        self.t = t

    def wait(self):
        return self.t


def _exchange(inp: torch.Tensor, group, out_rows: int, out_splits, in_splits):
    """Async all-to-all of rows [N, dim] -> [out_rows, dim]; a group of one moves nothing."""
    if group is None or group.size == 1:
        return _Ready(inp)
    out = inp.new_empty((out_rows, inp.shape[1]))
    return comm.all_to_all_single(out, inp.contiguous(), group, out_splits, in_splits,
                                  async_op=True)


def overlap_all_to_alls(layers) -> None:
    """For a runner that overlaps the all-to-alls (the two-microbatch overlap, F&B pairs): each MoE
    layer's ep group is posted by the comm thread (the compute thread does not pay for posting) and
    its uneven count exchange flies while the rows are built (`early_counts`)."""
    for layer in layers:
        mlp = getattr(layer, "mlp", None)
        if getattr(mlp, "is_moe", False):
            comm.post_from_thread(mlp.group)
            mlp.early_counts = True


class MoE(Layer):
    """Router + E SwiGLU experts, this rank holding experts [lo, lo + local)."""

    is_moe = True

    def __init__(self, cfg, index: int, router: Param, w1: Param, w3: Param, w2: Param,
                 load: ExpertLoad, group=None, dispatch: str = "uneven", lo: int = 0):
        if dispatch not in DISPATCH_MODES:
            raise ValueError(f"unknown EP dispatch {dispatch!r}: pick uneven or even")
        self.cfg, self.index, self.dispatch, self.load = cfg, index, dispatch, load
        self.router, self.w1, self.w3, self.w2 = router, w1, w3, w2
        self.group = group
        self.ep = group.size if group is not None else 1
        self.local = cfg.experts // self.ep
        self.lo = lo                                            # first global expert held here
        self.gs = group_tokens(cfg)
        self.global_groups = cfg.batch * cfg.seq // self.gs

    early_counts = False    # uneven: exchange the counts before building rows (overlap sets it)
    shared = None           # SwiGLU of the always-applied experts (DeepSeek); none in GShard
    bias = None             # per-expert selection bias (DeepSeek's balancing); none in GShard

    def own_params(self):
        return {"router.weight": self.router, "experts.w1.weight": self.w1,
                "experts.w3.weight": self.w3, "experts.w2.weight": self.w2}

    def sublayers(self):
        return {"shared": self.shared} if self.shared is not None else {}

    def route(self, logits):
        """The family's routing of this rank's tokens; logits [T, E]."""
        return route(logits, self.cfg, self.gs, self.global_groups)

    def gate_backward(self, r, dw):
        """dlogits [T, E] from the gate values' grad dw [T, K] and the balance loss."""
        return gate_backward(r, dw, self.cfg.top_k)

    # ---------------------------------------------------------------- forward phases
    def forward_dispatch(self, x):                              # x [B, S, dim]
        shape = x.shape
        xt = x.reshape(-1, shape[-1])                           # [T, dim]
        if xt.shape[0] % self.gs:
            raise ValueError(f"MoE layer {self.index} got {xt.shape[0]} tokens, not whole routing "
                             f"groups of {self.gs}: context parallel cannot shard an MoE model")
        e = self.cfg.experts
        with events.span("router + dispatch rows", "F", layer=self.index):
            logits = xt @ self.router.data.t()                  # [T, E]
            r = self.route(logits)
            kept = torch.bincount(r.idx.reshape(-1)[r.keep.reshape(-1)], minlength=e)  # [E]
            uneven = self.dispatch == "uneven"
            # what each expert gets is known now: with early_counts its owner is told before the
            # rows are built, the exchange in flight under that work
            counts = self._exchange_counts(kept) if uneven and self.early_counts else None
            rows = (uneven_rows(r, xt.dtype) if uneven else
                    even_rows(r, self.gs, capacity(self.cfg, self.gs), xt.dtype))
            send = gather_rows(xt, rows)                        # [N, dim] grouped by expert
            chosen = torch.bincount(r.idx.reshape(-1), minlength=e)                     # [E]
        if uneven and counts is None:
            counts = self._exchange_counts(rows.counts)
        self.load.record(self.index, kept, chosen, float(r.aux.detach()), self.bias)
        if counts is None:                                      # equal splits: nothing to tell
            recv_counts = rows.counts.view(self.ep, self.local)    # [ep, local]
        else:
            recv_counts = counts.wait().view(self.ep, self.local)  # [ep, local]
        in_splits = rows.counts.view(self.ep, self.local).sum(1).tolist()   # [ep] rows to each rank
        out_splits = recv_counts.sum(1).tolist()                # [ep] rows from each source
        c = Ctx(shape=shape, xt=xt, r=r, rows=rows, in_splits=in_splits, out_splits=out_splits,
                recv_counts=recv_counts, aux_loss=r.aux)
        c.pending = _exchange(send, self.group, sum(out_splits), out_splits, in_splits)
        if self.shared is not None:   # computed while the dispatch is in flight
            with events.span("shared experts", "expert", layer=self.index):
                c.shared_y, c.shared_ctx = self.shared.forward(xt)  # [T, dim]
        return c

    def _exchange_counts(self, counts: torch.Tensor):
        """Issued, not waited: wait() gives [ep * local], the rows each source rank sends to
        each of my experts (uneven rows equal the kept choices per expert)."""
        if self.ep == 1:
            return _Ready(counts)
        out = torch.empty_like(counts)
        return comm.all_to_all_single(out, counts, self.group, async_op=True)

    def wait(self, c):
        """Block until the phase's all-to-all has landed (kept apart so waits are not compute)."""
        if c.pending is not None:
            c.arrived, c.pending = c.pending.wait(), None
        return c.arrived

    def _grouping(self, c):
        """Received rows come [source][local expert]; the experts want [local expert][source]."""
        per = c.recv_counts.reshape(-1)                         # [ep * local]
        owner = torch.arange(self.local, device=per.device).repeat(self.ep).repeat_interleave(per)
        c.perm = torch.sort(owner, stable=True).indices
        c.inv = torch.argsort(c.perm)
        c.expert_counts = c.recv_counts.sum(0).tolist()         # [local]

    def forward_experts(self, c) -> None:
        recv = self.wait(c)                                     # [M, dim]
        with events.span("experts", "expert", layer=self.index, rows=int(recv.shape[0])):
            self._grouping(c)
            y, c.cx = self.run_experts(recv.index_select(0, c.perm), c.expert_counts)
            y = y.index_select(0, c.inv)                        # back to arrival order
        c.pending = _exchange(y, self.group, c.rows.src.numel(), c.in_splits, c.out_splits)

    def run_experts(self, rows, counts: list[int]):
        """rows [M, dim] grouped by local expert -> (outputs [M, dim], ctx); tests swap it."""
        return experts_forward(self.w1.data, self.w3.data, self.w2.data, rows, counts)

    def forward_combine(self, c):
        ret = self.wait(c)                                      # [N, dim] in send order
        with events.span("combine", "F", layer=self.index):
            c.ret = ret
            out = combine(ret, c.rows, c.r, c.xt.shape[0])
            if self.shared is not None:
                out = out + c.shared_y
                c.shared_y = None
        return out.view(c.shape), c                             # [B, S, dim]

    def forward(self, x):
        c = self.forward_dispatch(x)
        self.forward_experts(c)
        return self.forward_combine(c)

    # ---------------------------------------------------------------- backward phases
    def backward_combine(self, c, dy) -> None:
        with events.span("combine dX", "B", layer=self.index):
            dyt = dy.reshape(-1, dy.shape[-1])                  # [T, dim]
            drows, c.dw = combine_backward(dyt, c.ret, c.rows, c.r)
        c.ret = None
        c.pending = _exchange(drows, self.group, sum(c.out_splits), c.out_splits, c.in_splits)
        if self.shared is not None:   # under the combine grads' all-to-all
            with events.span("shared experts dX", "B", layer=self.index):
                c.shared_dx = self.shared.backward_input(c.shared_ctx, dyt)   # [T, dim]

    def backward_experts(self, c) -> None:
        dy = self.wait(c)                                       # [M, dim] arrival order
        with events.span("experts dX", "B", layer=self.index):
            dx = experts_backward_input(self.w1.data, self.w3.data, self.w2.data, c.cx,
                                        dy.index_select(0, c.perm))
            dx = dx.index_select(0, c.inv)
        c.pending = _exchange(dx, self.group, c.rows.src.numel(), c.in_splits, c.out_splits)

    def backward_dispatch(self, c):
        drows = self.wait(c)                                    # [N, dim] send order
        with events.span("router dX", "B", layer=self.index):
            t = c.xt.shape[0]
            dxt = scatter_rows(drows, c.rows, t)
            c.dlogits = self.gate_backward(c.r, c.dw)          # [T, E]
            dxt = dxt + c.dlogits @ self.router.data
            if self.shared is not None:
                dxt = dxt + c.shared_dx
                c.shared_dx = None
        return dxt.view(c.shape)                                # [B, S, dim]

    def backward_input(self, c, dy):
        self.backward_combine(c, dy)
        self.backward_experts(c)
        return self.backward_dispatch(c)

    def backward_expert_weights(self, c) -> None:
        with events.span("experts dW", "W", layer=self.index):
            d1, d3, d2 = experts_backward_weight(c.cx, self.w1.data, self.w3.data, self.w2.data)
        self.w1.accumulate(d1)
        self.w3.accumulate(d3)
        self.w2.accumulate(d2)
        if self.shared is not None:
            with events.span("shared experts dW", "W", layer=self.index):
                self.shared.backward_weight(c.shared_ctx)
            c.shared_ctx = None

    def backward_router_weight(self, c) -> None:
        with events.span("router dW", "W", layer=self.index):
            self.router.accumulate_matmul(c.dlogits.t(), c.xt)  # [E, dim]
        c.dlogits = c.xt = None

    def backward_weight(self, c) -> None:
        self.backward_expert_weights(c)
        self.backward_router_weight(c)
