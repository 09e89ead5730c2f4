"""Builds a rank's local model from a Plan and runs one training step: the same path for every
plan, from world 1 to 5-D.

    layers   = the model's stage layers with this rank's shards (tp / cp / ep substitutions)
    runner   = microbatch loop (no pipeline) or the pipeline executor (pp > 1)
    sync     = gradient sync and optimizer (naive / bucketed DP, ZeRO-1/2/3)
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from kernels import comm

from kernels.comm import events
from kernels.data import dp_slice, global_batch
from kernels.mesh import Plan, coord_label, coords, partition, validate
from kernels.model import (LayerHooks, ModelConfig, build_model, forward_backward,  # noqa: F401
                           init_params, named_params)
from kernels.optim import make_optimizer

GROUP_DIMS = ("tp", "cp", "dp", "pp", "ep", "ep_dp", "cp_dp")


@dataclass
class RankContext:
    """What a rank knows of the world: its plan, coordinates and one group per dimension."""
    plan: Plan
    cfg: ModelConfig
    rank: int
    coords: dict
    groups: dict = field(default_factory=dict)   # name -> comm.Group

    @property
    def label(self) -> str:
        return coord_label(self.plan, self.rank)

    def group(self, name: str) -> comm.Group:
        return self.groups[name]


def build_groups(plan: Plan) -> dict[str, comm.Group]:
    """Every rank calls this in the same order; groups of one rank make no process group."""
    return {dim: comm.new_groups(dim, partition(plan, dim)) for dim in GROUP_DIMS}


def model_config_for(plan: Plan, cfg: ModelConfig) -> ModelConfig:
    """The plan's MoE flags override the model's (experts, top-k, capacity)."""
    if plan.experts:
        cfg = replace(cfg, experts=plan.experts, top_k=plan.top_k,
                      capacity_factor=plan.capacity_factor)
    return cfg


@dataclass
class StepResult:
    step: int
    loss: float
    step_ms: float
    compute_ms: float = 0.0
    comm_ms: float = 0.0          # merged in-flight comm time
    overlap_ms: float = 0.0       # comm in flight while this rank computed
    wait_ms: float = 0.0
    extra: dict = field(default_factory=dict)


class Engine:
    def __init__(self, plan: Plan, cfg: ModelConfig, rank: int = 0, seed: int = 0,
                 optim: str = "adamw", lr: float | None = None, backward: str = "hand",
                 weight_decay: float | None = None, groups: dict | None = None,
                 device: str = "cpu"):
        cfg = model_config_for(plan, cfg)
        self.plan = validate(plan, cfg, plan.world or None)
        self.cfg, self.seed, self.backward = cfg, seed, backward
        if backward not in ("hand", "autograd"):
            raise ValueError(f"unknown backward {backward!r}: pick hand or autograd")
        groups = groups if groups is not None else build_groups(self.plan)
        comm.set_collectives(self.plan.collectives)    # native (gloo / nccl) or hand (kernels.comm.collectives)
        self.ctx = RankContext(self.plan, cfg, rank, coords(self.plan, rank), groups)
        self.device = torch.device(device)
        self.layers = build_local_layers(self.ctx, seed, self.device)
        self.runner = make_runner(self.ctx, self.layers, backward)
        if self.plan.pp > 1:  # keep only this rank's stages: the others' weights are freed
            self.layers = [lay for ch in self.runner.chunks for lay in ch.layers]
        self.params = self.runner.params()              # name -> Param held by this rank
        self.optimizer = make_optimizer(optim, lr, weight_decay)
        self.sync = make_grad_sync(self.ctx, self.params, self.optimizer)
        self.step_count = 0

    # ---------------------------------------------------------------- one step
    def local_batch(self, step: int):
        """This rank's inputs and targets: its dp slice (and cp piece) of the global batch."""
        ids, targets = global_batch(self.cfg.batch, self.cfg.seq, self.cfg.vocab, self.seed, step)
        c = self.ctx.coords
        ids, targets = dp_slice(ids, c["dp"], self.plan.dp), dp_slice(targets, c["dp"], self.plan.dp)
        ids, targets = ids.to(self.device), targets.to(self.device)
        return self.runner.shard_sequence(ids), self.runner.shard_sequence(targets)

    def step(self) -> StepResult:
        step = self.step_count
        comm.oplog.clear()
        t0 = events.now_ns()
        with events.span("step", "step", step=step):
            ids, targets = self.local_batch(step)
            self.sync.start_step()
            loss_part, compute_spans = self.runner.forward_backward(ids, targets, self.cfg.batch *
                                                                    self.cfg.seq, self.sync.hooks)
            self.sync.finish_backward()
            self.sync.optimizer_step()
            loss = torch.tensor([float(loss_part) if self.runner.owns_loss() else 0.0],
                                dtype=torch.float64, device=self.device)
            comm.all_reduce(loss, comm.world_group())
        t1 = events.now_ns()
        self.step_count += 1
        res = StepResult(step, loss.item(), (t1 - t0) / 1e6)
        _fill_overlap(res, compute_spans, comm.oplog.clear(), t0, t1)
        res.extra.update(self.sync.step_stats())
        if self.plan.cp > 1:  # attention time / FLOPs / K/V overlap of this step (kernels/cp.py)
            res.extra.update(__import__("kernels.cp.core", fromlist=["cp_stats"]).cp_stats())
        if self.cfg.experts:  # expert load (tokens per expert, dropped, aux loss); dense: nothing
            from kernels.ep.layer import moe_stats
            res.extra.update(moe_stats())
        return res

    # ---------------------------------------------------------------- views for snapshots / --check
    def grad_pieces(self) -> list[dict]:
        """This rank's share of every full gradient, with where it sits in the global tensor."""
        return self.sync.grad_pieces()

    def param_pieces(self) -> list[dict]:
        return self.sync.param_pieces()


def _merge(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _subtract(x, y):
    """Merged intervals x minus merged intervals y: a rank blocked in a wait is not computing."""
    out, j = [], 0
    for a, b in x:
        while j < len(y) and y[j][1] <= a:
            j += 1
        k = j
        while k < len(y) and y[k][0] < b:
            if y[k][0] > a:
                out.append((a, y[k][0]))
            a = max(a, y[k][1])
            k += 1
        if a < b:
            out.append((a, b))
    return out


def _length(iv) -> int:
    return sum(b - a for a, b in iv)


def _intersect(x, y) -> int:
    i = j = total = 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        total += max(0, b - a)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def _fill_overlap(res: StepResult, compute_spans, ops, t0, t1) -> None:
    """Compute / comm / overlap of this step from the comm layer's own timestamps (no tracer)."""
    comp = _subtract(_merge(compute_spans), _merge([w for o in ops for w in (o.waits or [])]))
    commv = _merge([(o.t_issue, o.t_complete or t1) for o in ops if o.nbytes and o.op != "barrier"])
    res.compute_ms = _length(comp) / 1e6
    res.comm_ms = _length(commv) / 1e6
    res.overlap_ms = _intersect(comp, commv) / 1e6
    res.wait_ms = sum(o.wait_ns for o in ops) / 1e6
    res.extra["comm_bytes"] = sum(o.nbytes for o in ops)
    res.extra["comm_ops"] = len(ops)


# ---------------------------------------------------------------- building blocks by dimension

def build_local_layers(ctx: RankContext, seed: int, device=None) -> list:
    """The full layer list with this rank's tp / cp / ep shards (pipeline slicing comes later)."""
    plan, cfg = ctx.plan, ctx.cfg
    dtype = torch.bfloat16 if plan.dtype == "bf16" else torch.float32  # master copy: optimizer
    tensors = init_params(cfg, seed, dtype)
    if device is not None and device.type != "cpu":  # NCCL under torchrun: weights on the GPU
        tensors = {k: v.to(device) for k, v in tensors.items()}
    if plan.tp > 1:
        from kernels.tp.layers import build_tp_layers
        layers = build_tp_layers(cfg, tensors, ctx)
    else:
        layers = build_model(cfg, seed, dtype, tensors, rank_ctx=ctx).layers
    if plan.cp > 1:
        from kernels.cp.core import apply_context_parallel
        apply_context_parallel(layers, ctx)
    return layers


class MicrobatchRunner:
    """No pipeline: every microbatch runs forward then backward through all layers."""

    def __init__(self, ctx: RankContext, layers: list, backward: str):
        self.ctx, self.layers, self.backward = ctx, layers, backward
        self.cp_shard = None
        if ctx.plan.cp > 1:
            from kernels.cp.core import sequence_shard
            self.cp_shard = lambda t: sequence_shard(t, ctx)

    def params(self) -> dict:
        return named_params(self.layers)

    def shard_sequence(self, t):
        return self.cp_shard(t) if self.cp_shard else t

    def role(self) -> str:
        return f"all {self.ctx.cfg.layers} layers"

    def owns_loss(self) -> bool:
        return self.ctx.coords["tp"] == 0  # vocab-parallel loss is the same on every tp rank

    def forward_backward(self, ids, targets, denom, hooks):
        m = self.ctx.plan.microbatches
        loss, spans = 0.0, []
        for mb, (x, t) in enumerate(zip(ids.chunk(m), targets.chunk(m))):
            t0 = events.now_ns()
            with events.span("F+B", "FB", mb=mb):
                loss = loss + forward_backward(self.layers, x, t, denom, self.backward, hooks)
            spans.append((t0, events.now_ns()))
        return loss, spans


def make_runner(ctx: RankContext, layers: list, backward: str):
    if ctx.plan.overlap and ctx.plan.pp == 1:
        from kernels.ep.overlap import OverlapRunner  # two microbatches: a2a behind compute
        return OverlapRunner(ctx, layers, backward)
    if ctx.plan.pp > 1:
        from kernels.pp.executor import PipelineRunner
        return PipelineRunner(ctx, layers, backward)
    return MicrobatchRunner(ctx, layers, backward)


def make_grad_sync(ctx: RankContext, params: dict, optimizer):
    from kernels.dp.sync import make_grad_sync as _make
    return _make(ctx, params, optimizer)
