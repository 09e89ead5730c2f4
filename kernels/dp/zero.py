"""ZeRO-1/2/3 over each sync group (dp, or ep_dp for experts), on flat padded buffers.

Params are packed into `FlatUnit`s (kernels/dp/buckets.py), each padded to divide the group size N;
rank r owns elements [r * chunk, (r + 1) * chunk) of every unit. The optimizer (AdamW or SGD
from kernels/optim.py, unchanged) runs on one flat Param per unit shard, so its state is the
shard's size and its arithmetic is the dense one's, element by element.

    ZeRO-1  units = buckets; grads all-reduced (async, in backward); each rank updates its
            shard; the updated shards are all-gathered back into the full flat params.
    ZeRO-2  as ZeRO-1, but each bucket is reduce-scattered, so a rank keeps only its grad
            shard; the full grad buffer lives from the bucket's first grad to its sync.
    ZeRO-3  units = layers; only shards persist. LayerHooks all-gather a layer's params before
            its forward and again before its backward (kernels/dp/gather.py: the next layer's
            gather prefetched asynchronously, in the order recorded on the first step), free
            them after, and reduce-scatter its grads right after its backward (after_backward: a
            runner that defers W must call it after W).

bf16: params and grads bf16, the optimizer keeps fp32 master, m and v for each shard.
"""
from __future__ import annotations

import torch

from kernels import comm
from kernels.comm import events
from kernels.dp.buckets import ReadyOrder, build_units, global_pieces, prod
from kernels.dp.gather import LayerGather
from kernels.dp.sync import GradSync
from kernels.layers import Param
from kernels.memory import account_of
from kernels.model import LayerHooks


def layer_key(name: str) -> str:
    """The stage layer a canonical param name belongs to (ZeRO-3's unit of gathering)."""
    if name.startswith("layers."):
        return ".".join(name.split(".")[:2])
    return "embed" if name.startswith("embed.") else "head"


class ZeroHooks(LayerHooks):
    """Grads straight into the flat buffers; ZeRO-3: a layer's params around its use, and its
    grads reduce-scattered right after its backward."""

    def __init__(self, sync):
        self.sync = sync

    def before_forward(self, layer):
        if self.sync.stage == 3:
            self.sync.layer_gather.gather_layer(layer)

    def after_forward(self, layer):
        if self.sync.stage == 3:
            self.sync.layer_gather.release_layer(layer)

    def before_backward(self, layer):
        if self.sync.stage == 3:
            self.sync.layer_gather.gather_layer(layer)
        for u, i in self.sync.slots_of(layer):   # grads accumulate straight into the buffer
            u.adopt_grad(i)

    def after_backward(self, layer):
        if self.sync.stage == 3:
            self.sync.scatter_layer(layer)
            self.sync.layer_gather.release_layer(layer)


class ZeroSync(GradSync):
    """ZeRO-1/2/3 on the units of each sync group: the optimizer updates this rank's shards."""

    def __init__(self, ctx, params: dict, optimizer, accumulations: dict[str, int], bucket_key,
                 stage: int):
        """accumulations: param name -> grad accumulations a step (runner.accumulations()): when
        a ZeRO-1/2 bucket is final, and bucket_key: params of different keys never share one
        (runner.bucket_key); ZeRO-3's units are layers, reduce-scattered after every backward."""
        self.stage = stage
        super().__init__(ctx, params, optimizer)
        unit_bytes = None if stage == 3 else ctx.plan.bucket_mb * 2 ** 20
        self.units = build_units(ctx, params, unit_bytes, pad_to_group=True,
                                 split_key=layer_key if stage == 3 else bucket_key)
        self.slot = {id(p): (u, i) for u in self.units for i, p in enumerate(u.params)}
        for u in self.units:
            self._shard_unit(u)
        optimizer.init_state([u.shard for u in self.units])
        self.hooks = ZeroHooks(self)
        self.handles: list = []
        self.rs_done: set = set()
        self._layer_slots: dict[int, list] = {}
        if stage in (1, 2):
            self.order = ReadyOrder(self.units, accumulations, self._issue, self.reduce_partial)
            hook = self.order.on_grad
        else:
            hook = self._adopt
            self.layer_gather = LayerGather(self.units, self.layer_units, account_of(ctx.stats))
        for p in self.plist:
            p.grad_hooks.append(hook)

    def _init_optimizer_state(self) -> None:
        pass  # state belongs to the shards, created in __init__

    def _shard_unit(self, u) -> None:
        u.rank, lo = u.group.rank, u.group.rank * u.chunk
        full = torch.zeros(u.padded, dtype=u.dtype)                 # [padded]
        for i, p in enumerate(u.params):
            u.view(full, i).copy_(p.data)
        if self.stage == 3:
            shard = full[lo:lo + u.chunk].clone()                   # [chunk], all that persists
            for p in u.params:
                p.data = torch.empty(0, dtype=u.dtype)
        else:
            u.full_param = full
            for i, p in enumerate(u.params):
                p.data = u.view(full, i)
            shard = full[lo:lo + u.chunk]                           # a view: updates land in full
        u.shard = Param(f"zero{self.stage}.{u.group.name}.unit{u.index}", shard)
        if self.stage == 1:
            u.bind_grads()
            u.shard.grad = u.grad[lo:lo + u.chunk]
        else:
            u.shard.grad = torch.zeros(u.chunk, dtype=u.dtype)     # [chunk]

    # ---------------------------------------------------------------- step
    def start_step(self) -> None:
        super().start_step()
        self.handles = []
        if self.stage in (1, 2):
            self.order.reset()
            for u in self.units:
                if self.stage == 1:
                    u.grad.zero_()
        else:
            self.rs_done = set()
            for u in self.units:
                u.shard.grad.zero_()
            self.layer_gather.start_step()

    def _adopt(self, prm) -> None:
        u, i = self.slot[id(prm)]
        u.adopt_grad(i)

    def _issue(self, u) -> None:
        """ZeRO-1/2: a bucket's grads are final: all-reduce or reduce-scatter it, async."""
        if self.stage == 1:
            h = comm.all_reduce(u.grad, u.group, async_op=True)
        else:
            h = comm.reduce_scatter(u.shard.grad, u.grad, u.group, async_op=True)
        self.sync_records.append(h.rec)
        self.handles.append((h, None, u))

    def finish_backward(self) -> None:
        self.t_backward_end = events.now_ns()
        if self.stage in (1, 2):
            self.order.flush()
        else:
            for u in self.units:               # grads no after_backward hook reduce-scattered
                if u.grad is not None:
                    self._scatter(u)
            self.layer_gather.finish_step()
        with events.span("grad sync wait", "wait"):
            for h, tmp, u in self.handles:
                h.wait()
                if tmp is not None:
                    u.shard.grad.add_(tmp)
        self.handles = []
        if self.stage >= 2:                    # keep only the owned grad shard
            for u in self.units:
                u.grad = None
                for p in u.params:
                    p.grad = None

    def optimizer_step(self) -> None:
        self.optimizer.step([u.shard for u in self.units])
        if self.stage == 3:
            return
        hs = [comm.all_gather(u.full_param, u.shard.data.clone(), u.group, async_op=True)
              for u in self.units]
        with events.span("param all-gather wait", "wait"):
            comm.wait_all(hs)

    # ---------------------------------------------------------------- layers (ZeRO-3's units)
    def slots_of(self, layer) -> list:
        """(unit, index in unit) of each of the layer's params (every stage adopts grads by it)."""
        key = id(layer)
        if key not in self._layer_slots:
            self._layer_slots[key] = [self.slot[id(p)] for p in layer.params().values()
                                      if id(p) in self.slot]
        return self._layer_slots[key]

    def layer_units(self, layer) -> list:
        seen = []
        for u, _ in self.slots_of(layer):
            if u not in seen:
                seen.append(u)
        return seen

    def scatter_layer(self, layer) -> None:
        """ZeRO-3: reduce-scatter the grads of the layer's units, right after its backward."""
        for u in self.layer_units(layer):
            self._scatter(u)

    def _scatter(self, u) -> None:
        """Reduce-scatter this unit's grads of the microbatch just done; the buffer is let go."""
        for i, p in enumerate(u.params):
            if p.grad is not None:
                u.adopt_grad(i)
            self.reduce_partial(p)
        if u.grad is None:
            u.grad = torch.zeros(u.padded, dtype=u.dtype)
        first = id(u) not in self.rs_done
        self.rs_done.add(id(u))
        out = u.shard.grad if first else torch.empty(u.chunk, dtype=u.dtype)
        h = comm.reduce_scatter(out, u.grad, u.group, async_op=True)
        self.sync_records.append(h.rec)
        self.handles.append((h, None if first else out, u))
        u.grad = None                                # the handle's op still holds the buffer
        for p in u.params:
            p.grad = None

    # ---------------------------------------------------------------- views
    def owned(self, u, q: int):
        """(param index, local flat start, stop, offset in the shard) of group rank q's chunk."""
        lo, hi = q * u.chunk, (q + 1) * u.chunk
        for i, (off, n) in enumerate(zip(u.offsets, u.numels)):
            a, b = max(lo, off), min(hi, off + n)
            if a < b:
                yield i, a - off, b - off, a - lo

    def _pieces(self, u, q: int, flat_of_shard=None, key: str = "tensor") -> list[dict]:
        out = []
        for i, a, b, c in self.owned(u, q):
            p = u.params[i]
            pos = c
            for kind, idx in global_pieces(p, u.shapes[i], a, b):
                n = b - a if kind == "flat" else prod([hi - lo for lo, hi in idx])
                pc = {"name": u.names[i], "global_shape": list(p.global_shape), "kind": kind,
                      "index": idx, "rank": u.group.ranks[q]}
                if flat_of_shard is not None:
                    pc[key] = flat_of_shard(pos, pos + n)
                pos += n
                out.append(pc)
        return out

    def grad_pieces(self) -> list[dict]:
        if self.stage == 1:
            return super().grad_pieces()
        return [pc for u in self.units for pc in self._pieces(
            u, u.rank, lambda a, b, u=u: u.shard.grad[a:b].detach().clone())]

    def param_pieces(self) -> list[dict]:
        if self.stage < 3:
            return super().param_pieces()
        return [pc for u in self.units for pc in self._pieces(
            u, u.rank, lambda a, b, u=u: u.shard.data[a:b].detach().clone())]

    def optimizer_pieces(self) -> list[dict]:
        st, out = self.optimizer.state, []
        for u in self.units:
            s = st.get(u.shard.name, {})
            for pc in self._pieces(u, u.rank, lambda a, b, s=s: {k: v[a:b] for k, v in s.items()},
                                   key="state"):
                if pc["state"]:
                    pc["step"] = self.optimizer.step_count
                    out.append(pc)
        return out

    def shard_map(self) -> dict:
        out: dict[str, list] = {}
        for u in self.units:
            for q in range(u.group.size):
                for pc in self._pieces(u, q):
                    out.setdefault(pc["name"], []).append(
                        {"rank": pc["rank"], "kind": pc["kind"], "index": pc["index"]})
        return out

    def ledger(self) -> dict:
        def nbytes(ts):
            return sum(t.numel() * t.element_size() for t in ts if t is not None)
        params = nbytes(u.shard.data if self.stage == 3 else u.full_param for u in self.units)
        grads = nbytes(u.grad if self.stage == 1 else u.shard.grad for u in self.units)
        out = {"stage": self.stage, "params": params, "grads": grads,
               "optimizer": self.optimizer.state_bytes(),
               "gathered_peak": self.layer_gather.gathered_peak if self.stage == 3 else 0}
        return self._with_formula(out, [(u.numel, u.padded, u.dtype, u.group.size)
                                        for u in self.units])


def make_zero(ctx, params: dict, optimizer, accumulations: dict[str, int], bucket_key) -> ZeroSync:
    stage = ctx.plan.zero
    if stage not in (1, 2, 3):
        raise ValueError(f"unknown ZeRO stage {stage}: pick 1, 2 or 3 (0 is plain DP)")
    return ZeroSync(ctx, params, optimizer, accumulations, bucket_key, stage)


__all__ = ["ZeroSync", "ZeroHooks", "make_zero", "layer_key"]
