"""Gradient sync over data-parallel replicas, and the optimizer step that follows it.

Every rank's Params fall in sync groups: dense ones over dp (cp x dp when context parallel),
expert ones over the ranks holding the same experts (ep_dp). Model-parallel partial grads
(`Param.replicated_over`, e.g. sequence-parallel norms over tp) are summed first.

`GradSync` is the interface the engine drives; `NaiveDP` all-reduces every grad after backward.
"""
from __future__ import annotations

import torch

from kernels import comm
from kernels.engine import LayerHooks


def sync_group_name(ctx, prm) -> str:
    if "dp_group" in prm.meta:
        return prm.meta["dp_group"]
    return "cp_dp" if ctx.plan.cp > 1 else "dp"


def piece_index(prm) -> list | None:
    """Where a Param's local tensor sits in its global tensor: [[start, stop], ...] per dim."""
    if prm.shard is None:
        return None
    return [[s.start or 0, s.stop if s.stop is not None else n]
            for s, n in zip(prm.shard, prm.global_shape)]


class GradSync:
    """Dense replicas: grads summed over the sync group, a full copy of params and optimizer."""

    def __init__(self, ctx, params: dict, optimizer):
        self.ctx, self.params, self.optimizer = ctx, params, optimizer
        self.hooks = LayerHooks()
        self.plist = list(params.values())

    def start_step(self) -> None:
        for prm in self.plist:
            prm.zero_grad()

    def reduce_model_parallel(self) -> None:
        """Partial grads of params replicated inside a model-parallel group (tp, cp ...)."""
        for prm in self.plist:
            for gname in prm.replicated_over:
                if prm.grad is not None:
                    comm.all_reduce(prm.grad, self.ctx.group(gname))

    def finish_backward(self) -> None:
        self.reduce_model_parallel()

    def optimizer_step(self) -> None:
        self.optimizer.step(self.plist)

    def step_stats(self) -> dict:
        return {}

    # ---- views
    def grad_pieces(self) -> list[dict]:
        return [{"name": n, "global_shape": list(p.global_shape), "kind": "slice",
                 "index": piece_index(p), "tensor": p.grad.detach().clone()}
                for n, p in self.params.items() if p.grad is not None]

    def param_pieces(self) -> list[dict]:
        return [{"name": n, "global_shape": list(p.global_shape), "kind": "slice",
                 "index": piece_index(p), "tensor": p.data.detach().clone()}
                for n, p in self.params.items()]

    def optimizer_pieces(self) -> list[dict]:
        st = getattr(self.optimizer, "state", {})
        out = []
        for n, p in self.params.items():
            s = st.get(p.name) or st.get(n)
            if s:
                out.append({"name": n, "kind": "slice", "index": piece_index(p),
                            "global_shape": list(p.global_shape),
                            "state": {k: v for k, v in s.items()},
                            "step": getattr(self.optimizer, "step_count", 0)})
        return out

    def ledger(self) -> dict:
        def nbytes(ts):
            return sum(t.numel() * t.element_size() for t in ts if t is not None)
        return {"params": nbytes(p.data for p in self.plist),
                "grads": nbytes(p.grad for p in self.plist),
                "optimizer": self.optimizer.state_bytes(), "gathered_peak": 0}


class NaiveDP(GradSync):
    """All-reduce every gradient, one by one, after backward: the textbook baseline."""

    def finish_backward(self) -> None:
        super().finish_backward()
        for prm in self.plist:
            g = self.ctx.group(sync_group_name(self.ctx, prm))
            if prm.grad is not None and g.size > 1:
                comm.all_reduce(prm.grad, g)


def make_grad_sync(ctx, params: dict, optimizer) -> GradSync:
    plan = ctx.plan
    if plan.zero:
        from kernels.zero import make_zero
        return make_zero(ctx, params, optimizer)
    if plan.grad_sync == "bucketed":
        return BucketedDP(ctx, params, optimizer)
    return NaiveDP(ctx, params, optimizer)
