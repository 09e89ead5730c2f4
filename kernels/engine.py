"""Builds a rank's local model from a Plan and runs one training step: the same path for every
plan, from world 1 to 5-D.

    layers   = the model's stage layers with this rank's shards (tp / cp / ep substitutions)
    runner   = microbatch loop (kernels/runners/microbatch.py), the EP overlap runner or the pipeline executor
    sync     = gradient sync and optimizer (naive / bucketed DP, ZeRO-1/2/3: kernels/dp); a bucket is
               final after the accumulations a step the runner gives (runner.accumulations()),
               and holds params of one runner.bucket_key (a pipeline rank's chunk)
    stats    = the per-step figures the layers recorded in the rank's context (expert load,
               attention time), drained into each step's result
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels import comm
from kernels.block import Block
from kernels.comm import events
from kernels.context import RankContext, build_groups
from kernels.cp.apply import apply_context_parallel
from kernels.data import dp_slice, global_batch
from kernels.dp import make_grad_sync
from kernels.ep.deepseek_layer import balance_biases
from kernels.memory import account_of
from kernels.model import build_model
from kernels.optim import make_optimizer
from kernels.pp.executor import PipelineRunner
from kernels.runners.ep_overlap import OverlapRunner
from kernels.runners.microbatch import MicrobatchRunner
from kernels.tp.layers import build_tp_layers
from kernels.weights import init_params
from planning.config import ModelConfig, model_config_for
from planning.intervals import CONTAINER_CATS, WAIT_CATS, in_ms, parts_figures, window_parts
from planning.mesh import Plan, coords

P2P_OPS = ("send", "recv")  # paired across ranks for their in flight (planning.intervals.pair_p2p)


@dataclass
class StepResult:
    step: int
    loss: float
    step_ms: float
    # this rank's step window by planning.intervals.figures (partui.analysis.figures.definitions' terms)
    compute_ms: float = 0.0       # leaf compute spans merged, less waits and posts
    comm_ms: float = 0.0          # comm in flight (issue to completion), merged
    overlapped_ms: float = 0.0    # comm in flight while this rank computed
    exposed_comm_ms: float = 0.0  # comm_ms - overlapped_ms
    wait_ms: float = 0.0          # blocked on or posting comm ops, merged
    extra: dict = field(default_factory=dict)


class Engine:
    def __init__(self, plan: Plan, cfg: ModelConfig, rank: int = 0, seed: int = 0,
                 optim: str = "adamw", lr: float | None = None, backward: str = "hand",
                 weight_decay: float | None = None, groups: dict | None = None,
                 device: str = "cpu"):
        cfg = model_config_for(plan, cfg)
        self.plan = plan.resolved()   # trusted: validated where it met its model (validate.plan_for_model)
        self.cfg, self.seed, self.backward = cfg, seed, backward
        if backward not in ("hand", "autograd"):
            raise ValueError(f"unknown backward {backward!r}: pick hand or autograd")
        groups = groups if groups is not None else build_groups(self.plan)
        comm.set_collectives(self.plan.collectives)    # native (gloo / nccl) or hand (kernels.comm.collectives)
        self.ctx = RankContext(self.plan, cfg, rank, coords(self.plan, rank), groups)
        self.device = torch.device(device)
        self.layers = build_local_layers(self.ctx, seed, self.device)
        for layer in self.layers:           # recompute: what blocks keep (kernels/recompute.py)
            if isinstance(layer, Block):
                layer.recompute = self.plan.recompute
        self.runner = make_runner(self.ctx, self.layers, backward)
        if self.plan.pp > 1:  # keep only this rank's stages: the others' weights are freed
            self.layers = [lay for ch in self.runner.chunks for lay in ch.layers]
        self.params = self.runner.params()              # name -> Param held by this rank
        self.optimizer = make_optimizer(optim, lr, weight_decay)
        self.sync = make_grad_sync(self.ctx, self.params, self.optimizer,
                                   self.runner.accumulations(), self.runner.bucket_key)
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
        events.drain_spans()
        t0 = events.now_ns()
        with events.span("step", "step", step=step):
            ids, targets = self.local_batch(step)
            self.account_model_state("step start")
            self.sync.start_step()
            # the step's figures take the leaf spans from the span log (fill_overlap)
            loss_part = self.runner.forward_backward(ids, targets, self.cfg.batch * self.cfg.seq,
                                                     self.sync.hooks)
            self.sync.finish_backward()
            self.account_model_state("optimizer")
            self.sync.optimizer_step()
            account_of(self.ctx.stats).set("workspace", self.optimizer.scratch_bytes())
            loss = torch.tensor([float(loss_part) if self.runner.owns_loss() else 0.0],
                                dtype=torch.float64, device=self.device)
            comm.all_reduce(loss, comm.world_group())
        t1 = events.now_ns()
        self.step_count += 1
        spans = events.drain_spans()
        # the window is the step span's own times, the ones a trace of this step records
        t0, t1 = next(((a, b) for cat, a, b in reversed(spans) if cat == "step"), (t0, t1))
        res = StepResult(step, loss.item(), (t1 - t0) / 1e6)
        fill_overlap(res, spans, comm.oplog.clear(), t0, t1)
        res.extra.update(self.sync.step_stats())
        # attention time / FLOPs / K/V overlap (cp), routing figures (MoE); dense, no cp: nothing
        res.extra.update(self.ctx.stats.drain())
        balance_biases(self.layers, res.extra.get("moe_layers", {}))   # DeepSeek: next step's bias
        return res

    def account_model_state(self, action: str) -> None:
        """Params, grads and optimizer state into the memory account, from the sync's ledger."""
        memory = account_of(self.ctx.stats)
        memory.recording = events.recorder() is not None   # samples and counters: traces only
        memory.at(action)
        ledger = self.sync.ledger()
        for kind in ("params", "grads", "optimizer"):
            memory.set(kind, ledger[kind])
        memory.set("workspace", self.optimizer.scratch_bytes())

    # ---------------------------------------------------------------- views for snapshots / --check
    def grad_pieces(self) -> list[dict]:
        """This rank's share of every full gradient, with where it sits in the global tensor."""
        return self.sync.grad_pieces()

    def param_pieces(self) -> list[dict]:
        return self.sync.param_pieces()


def fill_overlap(res: StepResult, spans, ops, t0, t1) -> None:
    """This step's figures (planning.intervals.parts_figures) from the spans the layers recorded
    ((cat, t0, t1): kernels.comm.events.drain_spans) and the op log's issue / completion / wait /
    post times; no tracer. A p2p op's in flight is its own here; extra["figure_parts"] and
    extra["p2p_ops"] let the controller pair it with its peer's (partui.world.results.step_line), so the
    step line counts what a trace of the step reports."""
    leaf = [(a, b) for cat, a, b in spans if cat not in CONTAINER_CATS and cat not in WAIT_CATS]
    waits = [(a, b) for cat, a, b in spans if cat in WAIT_CATS]
    waits += [w for o in ops for w in (o.waits or [])] + [o.post for o in ops if o.post]
    p2p = [(o.op, o.peer, o.tag, o.t_issue, in_flight_end(o, t1)) for o in ops
           if o.nbytes and o.op in P2P_OPS]
    in_flight = [(o.t_issue, in_flight_end(o, t1)) for o in ops if o.nbytes and o.op not in P2P_OPS]
    parts = window_parts(leaf, in_flight, waits, t0, t1)
    for name, value in in_ms(parts_figures(parts, [(a, b) for *_, a, b in p2p])).items():
        setattr(res, name, value)
    res.extra["figure_parts"], res.extra["p2p_ops"] = parts, p2p
    res.extra["comm_bytes"] = sum(o.nbytes for o in ops)
    res.extra["comm_ops"] = len(ops)


def in_flight_end(op, t_stop: int) -> int:
    """Done at the earlier of its completion and the return of its first wait (as a trace has it:
    partui.recording.trace); never seen done: in flight to the step's end."""
    ends = [t for t in (op.t_complete, min((w[1] for w in op.waits or []), default=None)) if t is not None]
    return max(op.t_issue, min(ends)) if ends else max(op.t_issue, t_stop)


# ---------------------------------------------------------------- building blocks by dimension

def build_local_layers(ctx: RankContext, seed: int, device=None) -> list:
    """The full layer list with this rank's tp / cp / ep shards (pipeline slicing comes later)."""
    plan, cfg = ctx.plan, ctx.cfg
    dtype = torch.bfloat16 if plan.dtype == "bf16" else torch.float32  # master copy: optimizer
    tensors = init_params(cfg, seed, dtype)
    if device is not None and device.type != "cpu":  # NCCL under torchrun: weights on the GPU
        tensors = {k: v.to(device) for k, v in tensors.items()}
    if plan.tp > 1:
        layers = build_tp_layers(cfg, tensors, ctx)
    else:
        layers = build_model(cfg, seed, dtype, tensors, rank_ctx=ctx).layers
    if plan.cp > 1:
        apply_context_parallel(layers, ctx)
    return layers


def make_runner(ctx: RankContext, layers: list, backward: str):
    if ctx.plan.overlap and ctx.plan.pp == 1:   # two microbatches: a2a behind compute
        return OverlapRunner(ctx, layers, backward)
    if ctx.plan.pp > 1:
        return PipelineRunner(ctx, layers, backward)
    return MicrobatchRunner(ctx, layers, backward)
