"""Runs one pp rank's action list (planning.pipeline.schedules) for real: async p2p, deferred weight
grads and DualPipe's overlapped forward-and-backward pairs (with fb_overlap, each pair interleaves
DeepSeek's parts of both sides, kernels/pp/parts.py, so the MoE all-to-alls fly under the other
microbatch's compute). This file is the runner (its setup and the step's walk of the list);
kernels/pp/step.py is one step's p2p and compute actions.

Semantics are the schedules' (see that module). DualPipe keeps two copies of the model: rank r
runs stage r of direction 0 and stage P-1-r of direction 1, so stage s's weights live on ranks s
and P-1-s. Their grads are partial: each Param lists the "pp_mirror" group in `replicated_over` so
the grad sync sums the two copies before dp sync, and both copies then take the same step.
`accumulations()`: each Param's `accumulate` calls a step, its chunk's gradient-producing actions
(the schedule record's `accumulations`, by default Schedule.accumulations: M, or M/2 for dualpipe),
so the dp sync fires on the last.
"""
from __future__ import annotations

from kernels.block import Block
from kernels.cp.layout import sequence_shard
from kernels.ep.layer import overlap_all_to_alls
from kernels.model import LayerHooks
from kernels.pp.parts import chunk_pair_order
from kernels.pp.stages import build_chunks
from kernels.pp.step import PipelineStep
from planning.pipeline.actions import COMPUTE_KINDS
from planning.pipeline.catalog import plan_schedule, schedule_spec
from planning.slow_spec import slow_factor


class PipelineRunner:
    """The engine's runner for pp > 1: this rank's chunks and its schedule."""

    def __init__(self, ctx, layers: list, backward: str):
        if backward != "hand":
            raise ValueError(f"pipeline parallel runs the hand-written backward (split into B "
                             f"and W), not {backward!r}: run with backward=hand")
        plan = ctx.plan
        self.ctx, self.plan = ctx, plan
        self.group = ctx.group("pp")
        self.rank = ctx.coords["pp"]
        self.slow = slow_factor(plan, ctx.rank, self.rank)   # --slow-rank / --slow-stage
        self.schedule = plan_schedule(plan)
        self.actions = self.schedule.actions[self.rank]
        self.chunks = build_chunks(layers, self.schedule, self.rank)   # the other stages' layers are dropped
        self._params = {}
        for ch in sorted(self.chunks, key=lambda c: c.stage):   # model order, as on mirrored ranks
            self._params.update(ch.params())
        spec = schedule_spec(plan.schedule)
        counts: dict[int, int] = {}   # id(Param) -> accumulations a step, over every chunk holding it
        for ch in self.chunks:
            n = spec.accumulations(self.schedule, self.rank, ch.index)   # the record's count
            for prm in ch.params().values():
                counts[id(prm)] = counts.get(id(prm), 0) + n
        self._accumulations = {name: counts[id(prm)] for name, prm in self._params.items()}
        self._chunk_of = {name: ch.index for ch in self.chunks for name in ch.params()}
        if self.schedule.directions == 2:
            assert "pp_mirror" in ctx.groups, "the rank context builds DualPipe's mirror group"
            for prm in self._params.values():
                if "pp_mirror" not in prm.replicated_over:
                    prm.replicated_over.append("pp_mirror")
        self.dtype = next(iter(self._params.values())).data.dtype
        self.fb_order = "parts" if plan.fb_overlap else "forward-first"   # see PipelineStep._FB
        if plan.fb_overlap:   # the all-to-alls a pair hides: posted by the comm thread
            overlap_all_to_alls([layer for ch in self.chunks for layer in ch.layers])
        self._pair_orders = {}   # (forward chunk, backward chunk) -> planning.pipeline.fb_order.pair_order
        # RECVs of the next `recv_ahead` computes are posted before the current one runs, so a
        # peer's tensor lands while this rank computes instead of after it asks (0: each RECV
        # where the schedule puts it)
        self.recv_ahead = 1
        self.compute_pos = [i for i, a in enumerate(self.actions)            # list positions
                            if a.kind in COMPUTE_KINDS]
        self.compute_order = {i: j for j, i in enumerate(self.compute_pos)}  # position -> j

    # ---------------------------------------------------------------- runner interface
    def params(self) -> dict:
        return dict(self._params)

    def accumulations(self) -> dict[str, int]:
        """Param name -> grad accumulations a step, from the schedule's action list."""
        return dict(self._accumulations)

    def bucket_key(self, name: str) -> int:
        """The param's local chunk: a chunk's grads are final at its last gradient-producing
        action, so a bucket holding two chunks would wait for the later one."""
        return self._chunk_of[name]

    def shard_sequence(self, t):
        """This rank's tokens of a [batch, seq] tensor: its cp piece, or all of them."""
        return sequence_shard(t, self.ctx) if self.plan.cp > 1 else t

    def owns_loss(self) -> bool:
        """Ranks holding a head (the loss) or an MoE block (its aux loss); tp rank 0 only."""
        holds = any(ch.last or any(isinstance(lay, Block) and getattr(lay.mlp, "is_moe", False)
                                   for lay in ch.layers) for ch in self.chunks)
        return holds and self.ctx.coords["tp"] == 0

    def role(self) -> str:
        s = self.schedule
        parts = [f"stage {ch.stage}" + (f" dir {ch.index}" if s.directions == 2 else "")
                 + f" ({ch.block_range()}" + (", embed" if ch.first else "")
                 + (", head" if ch.last else "") + ")" for ch in self.chunks]
        return (f"pp rank {self.rank} of {s.pp}, {s.name} over {s.stages} stages: "
                + "; ".join(parts))

    # ---------------------------------------------------------------- one step
    def forward_backward(self, ids, targets, denom, hooks):
        m = self.plan.microbatches
        run = PipelineStep(self, ids.chunk(m), targets.chunk(m), denom, hooks or LayerHooks())
        acts, computes = self.actions, self.compute_order
        posted = 0                              # RECVs are posted in list order: FIFO per channel
        for i, a in enumerate(acts):
            if a.kind in COMPUTE_KINDS:
                j = computes[i] + self.recv_ahead     # post the RECVs of the next computes too
                stop = self.compute_pos[j] if j < len(computes) else len(acts)
                posted = run.post_recvs(acts, posted, stop)
                run.do(a)
            elif a.kind in ("RECV_F", "RECV_B"):
                posted = run.post_recvs(acts, posted, i + 1)
            else:
                run.do(a)
        run.finish()
        return run.loss

    def pair_order(self, chunk: int, chunk2: int) -> list:
        """The parts of an overlapped pair of (forward chunk, backward chunk) in their order."""
        if (chunk, chunk2) not in self._pair_orders:
            self._pair_orders[(chunk, chunk2)] = chunk_pair_order(self.chunks[chunk],
                                                                  self.chunks[chunk2])
        return self._pair_orders[(chunk, chunk2)]

    def act_shape(self, ids_mb) -> tuple:
        """Shape of the tensor crossing a stage boundary for one microbatch: [b, s, dim]."""
        b, s = ids_mb.shape
        if self.plan.sp:                         # sequence parallel keeps activations seq-sharded
            s //= self.plan.tp
        return (b, s, self.ctx.cfg.dim)
