"""Gradient sync over data-parallel replicas, and the optimizer step that follows it.

Every rank's Params fall in sync groups: dense ones over dp (cp x dp when context parallel),
expert ones over the ranks holding the same experts (ep_dp). Model-parallel partial grads
(`Param.replicated_over`, e.g. sequence-parallel norms over tp) are summed first.

`GradSync` is the interface the engine drives; `NaiveDP` all-reduces every grad after backward;
`BucketedDP` packs grads into flat buckets (kernels/dp/buckets.py) and all-reduces each bucket
asynchronously the moment its last grad of the step lands, while backward goes on.

Accumulation counts: a bucket is final when each of its params has been accumulated as often
as the runner accumulates it per step. The runner says how often (`runner.accumulations()`,
param name -> count: M microbatches, the EP overlap runner's pieces, a pipeline chunk's
gradient-producing actions, M/2 for DualPipe's) and the engine hands that to the sync it builds.
A bucket never spans two of the runner's `bucket_key`s (a pipeline rank's chunks, whose grads are
final at different actions: DualPipe's head-side chunk two computes before the end).
"""
from __future__ import annotations

import torch

from kernels import comm
from kernels.comm import events
from kernels.dp.buckets import ReadyOrder, build_units, global_pieces, overlap_share, sync_group_name
from kernels.layers import Param
from kernels.model import LayerHooks

__all__ = ["GradSync", "NaiveDP", "BucketedDP", "sync_group_name", "piece_index",
           "ledger_formula"]


def piece_index(prm) -> list | None:
    """Where a Param's local tensor sits in its global tensor: [[start, stop], ...] per dim."""
    if prm.shard is None:
        return None
    return [[s.start or 0, s.stop if s.stop is not None else n]
            for s, n in zip(prm.shard, prm.global_shape)]


def ledger_formula(stage: int, psi: int, psi_pad: int, n: int, p_bytes: int, g_bytes: int,
                   k_bytes: int) -> dict:
    """The ZeRO paper's per-rank model-state bytes for Psi elements over N replicas (padded Psi
    where buffers are padded to divide N): stage 0 (p+g+K)Psi ... stage 3 (p+g+K)Psi/N."""
    full, shard = psi if stage == 0 else psi_pad, psi_pad // n
    return {"params": p_bytes * (shard if stage == 3 else full),
            "grads": g_bytes * (shard if stage >= 2 else full),
            "optimizer": k_bytes * (shard if stage >= 1 else full)}


class GradSync:
    """Dense replicas: grads summed over the sync group, a full copy of params and optimizer."""

    stage = 0

    def __init__(self, ctx, params: dict, optimizer):
        self.ctx, self.params, self.optimizer = ctx, params, optimizer
        self.hooks = LayerHooks()
        self.plist = list(params.values())
        self.t_start = self.t_backward_end = 0
        self.sync_records: list = []   # comm records of this step's gradient sync
        self._init_optimizer_state()

    def _init_optimizer_state(self) -> None:
        if hasattr(self.optimizer, "init_state"):  # now, so the ledger shows it before step 1
            self.optimizer.init_state(self.plist)

    def start_step(self) -> None:
        self.t_start = events.now_ns()
        self.sync_records = []
        for prm in self.plist:
            prm.zero_grad()

    def reduce_partial(self, prm) -> None:
        """Sum a param's partial grads over model-parallel groups (tp, cp ...) before dp sync."""
        for gname in prm.replicated_over:
            if prm.grad is not None:
                comm.all_reduce(prm.grad, self.ctx.group(gname))

    def reduce_model_parallel(self) -> None:
        for prm in self.plist:
            self.reduce_partial(prm)

    def finish_backward(self) -> None:
        self.t_backward_end = events.now_ns()
        self.reduce_model_parallel()

    def optimizer_step(self) -> None:
        self.optimizer.step(self.plist)

    def step_stats(self) -> dict:
        share = overlap_share(self.sync_records, self.t_start, self.t_backward_end)
        return {} if share is None else {"grad_sync_overlap": share}

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

    def shard_map(self) -> dict:
        """{param name: [{rank, kind, index}]}: every replica holds this rank's whole piece."""
        out = {}
        for n, p in self.params.items():
            g = self.ctx.group(sync_group_name(self.ctx, p))
            whole = global_pieces(p, tuple(p.data.shape), 0, p.data.numel())
            out[n] = [{"rank": r, "kind": k, "index": idx} for r in g.ranks for k, idx in whole]
        return out

    def ledger(self) -> dict:
        def nbytes(ts):
            return sum(t.numel() * t.element_size() for t in ts if t is not None)
        out = {"stage": self.stage, "params": nbytes(p.data for p in self.plist),
               "grads": self._grad_bytes(), "optimizer": self.optimizer.state_bytes(),
               "gathered_peak": 0}
        return self._with_formula(out, [(p.data.numel(), p.data.numel(), p.data.dtype,
                                         self.ctx.group(sync_group_name(self.ctx, p)).size)
                                        for p in self.plist])

    def _grad_bytes(self) -> int:
        return sum(p.data.numel() * p.data.element_size() for p in self.plist)

    def _with_formula(self, out: dict, pieces: list[tuple]) -> dict:
        """pieces: (psi, padded psi, dtype, N) per unit; adds the paper's bytes beside ours."""
        k_of = getattr(self.optimizer, "bytes_per_element", lambda dt: 0)
        form = {"params": 0, "grads": 0, "optimizer": 0}
        for psi, pad, dtype, n in pieces:
            b = torch.tensor([], dtype=dtype).element_size()
            for k, v in ledger_formula(self.stage, psi, pad, n, b, b, k_of(dtype)).items():
                form[k] += v
        out["psi"] = sum(p[0] for p in pieces)
        out["psi_padded"] = sum(p[1] for p in pieces)
        out["n"] = max((p[3] for p in pieces), default=1)
        out["total"] = out["params"] + out["grads"] + out["optimizer"]
        form["total"] = sum(form.values())
        out["formula"] = form
        out["matches_formula"] = all(out[k] == form[k] for k in form)
        return out


class NaiveDP(GradSync):
    """All-reduce every gradient, one by one, after backward: the textbook baseline."""

    def finish_backward(self) -> None:
        super().finish_backward()
        for prm in self.plist:
            g = self.ctx.group(sync_group_name(self.ctx, prm))
            if prm.grad is not None and g.size > 1:
                comm.all_reduce(prm.grad, g)


class BucketedDP(GradSync):
    """Flat grad buckets in backward order, each all-reduced async as soon as it is final.

    backward's end only issues what is left; the optimizer then takes the buckets in sync
    order, waiting for each one's all-reduce just before updating it, so updating the early
    buckets hides the last buckets' all-reduce (torch DDP waits for all, then steps)."""

    def __init__(self, ctx, params: dict, optimizer, accumulations: dict[str, int], bucket_key):
        """accumulations: param name -> grad accumulations a step (runner.accumulations());
        bucket_key: name -> key, params of different keys never share a bucket (runner.bucket_key)."""
        super().__init__(ctx, params, optimizer)
        # No DDP-style small first bucket: on CPU gloo each extra collective costs more latency
        # than the earlier start saves (measured: world 4, small model, 0.91 -> 1.01 of DDP).
        self.units = build_units(ctx, params, ctx.plan.bucket_mb * 2 ** 20, pad_to_group=False,
                                 split_key=bucket_key)
        self.flat_params = []
        for u in self.units:
            u.bind_grads()                      # grads live in the buckets from now on
            u.full_param = torch.empty(u.padded, dtype=u.dtype)
            for i, p in enumerate(u.params):    # and params too: one optimizer op per bucket
                u.view(u.full_param, i).copy_(p.data)
                p.data = u.view(u.full_param, i)
            u.flat = Param(f"dp.{u.group.name}.bucket{u.index}", u.full_param)
            u.flat.grad = u.grad
            self.flat_params.append(u.flat)
        if hasattr(optimizer, "init_state"):
            optimizer.init_state(self.flat_params)
        self.order = ReadyOrder(self.units, accumulations, self._issue, self.reduce_partial)
        for p in self.plist:
            p.grad_hooks.append(self.order.on_grad)
        self.handles: list = []

    def _init_optimizer_state(self) -> None:
        pass  # the optimizer runs on the flat buckets, set up in __init__

    def optimizer_step(self) -> None:
        self.optimizer.begin_step()            # one step count, then one update per bucket
        for u, h in self._sync_order():
            if h is not None:
                with events.span("grad sync wait", "wait", bucket=u.index):
                    h.wait()
            self.optimizer.update([u.flat])    # elementwise: same result as per tensor
        self.handles = []

    def _sync_order(self) -> list[tuple]:
        """(unit, its all-reduce handle or None): unsynced units (groups of one) first."""
        issued = {id(u): h for h, u in self.handles}
        return ([(u, None) for u in self.units if id(u) not in issued] +
                [(u, h) for h, u in self.handles])

    def wait_sync(self) -> None:
        """Block until every bucket's all-reduce is done (the handles stay for the optimizer)."""
        if self.handles:
            with events.span("grad sync wait", "wait"):
                comm.wait_all([h for h, _ in self.handles])

    def grad_pieces(self) -> list[dict]:
        self.wait_sync()
        return super().grad_pieces()

    def optimizer_pieces(self) -> list[dict]:
        out = []
        for u in self.units:
            st = self.optimizer.state.get(u.flat.name)
            for i, p in enumerate(u.params if st else []):
                out.append({"name": u.names[i], "kind": "slice", "index": piece_index(p),
                            "global_shape": list(p.global_shape),
                            "state": {k: u.view(v, i) for k, v in st.items()},
                            "step": getattr(self.optimizer, "step_count", 0)})
        return out

    def start_step(self) -> None:
        self.wait_sync()           # a step whose optimizer never ran: its buffers are in use
        self.t_start = events.now_ns()
        self.sync_records = []
        for u in self.units:       # every grad is a view of a bucket: zero the buckets once
            u.zero_grads()
        self.order.reset()
        self.handles = []

    def _issue(self, unit) -> None:
        if unit.group.size == 1:
            return
        h = comm.all_reduce(unit.grad, unit.group, async_op=True)
        self.sync_records.append(h.rec)
        self.handles.append((h, unit))

    def finish_backward(self) -> None:
        self.t_backward_end = events.now_ns()
        self.order.flush()                     # issued, not waited: optimizer_step waits

    def _grad_bytes(self) -> int:
        return sum(u.grad.numel() * u.grad.element_size() for u in self.units)

