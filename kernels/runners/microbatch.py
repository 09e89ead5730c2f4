"""The engine's runner without a pipeline: every microbatch runs forward then backward through all
of this rank's layers. The EP overlap runner (kernels/runners/ep_overlap.py) and the pipeline executor
(kernels/pp/executor.py) keep its interface: params, accumulations (param name -> how many times a
step accumulates its grad: the grad sync's count of when a bucket is final), bucket_key (name ->
a key; params of different keys never share a grad bucket), shard_sequence, role, owns_loss and
forward_backward(ids, targets, denom, hooks) -> loss (the step's figures come from the span log).
"""
from __future__ import annotations

from kernels.comm import events
from kernels.context import RankContext
from kernels.cp.layout import sequence_shard
from kernels.memory import account_of
from kernels.model import forward_backward, named_params
from kernels.straggle import stretch
from planning.slow_spec import slow_factor


class MicrobatchRunner:
    """No pipeline: every microbatch runs forward then backward through all layers."""

    def __init__(self, ctx: RankContext, layers: list, backward: str):
        self.ctx, self.layers, self.backward = ctx, layers, backward
        self.slow = slow_factor(ctx.plan, ctx.rank, ctx.coords["pp"])   # --slow-rank / --slow-stage

    def params(self) -> dict:
        return named_params(self.layers)

    def accumulations(self) -> dict[str, int]:
        """Param name -> grad accumulations a step: one per microbatch."""
        return dict.fromkeys(self.params(), self.ctx.plan.microbatches)

    def bucket_key(self, name: str) -> None:
        """One key: every grad is final in the last microbatch, any two may share a bucket."""
        return None

    def shard_sequence(self, t):
        """This rank's tokens of a [batch, seq] tensor: its cp piece, or all of them."""
        return sequence_shard(t, self.ctx) if self.ctx.plan.cp > 1 else t

    def role(self) -> str:
        return f"all {self.ctx.cfg.layers} layers"

    def owns_loss(self) -> bool:
        return self.ctx.coords["tp"] == 0  # vocab-parallel loss is the same on every tp rank

    def forward_backward(self, ids, targets, denom, hooks):
        m = self.ctx.plan.microbatches
        loss, memory = 0.0, account_of(self.ctx.stats)
        for mb, (x, t) in enumerate(zip(ids.chunk(m), targets.chunk(m))):
            t0 = events.now_ns()
            memory.at(f"F+B mb{mb}")
            with events.span("F+B", "microbatch", mb=mb):  # a container: its layers are the compute
                loss = loss + forward_backward(self.layers, x, t, denom, self.backward, hooks,
                                               memory)
            stretch(t0, self.slow)
        return loss
