"""Building a block's MoE layer from the global tensors: the family (GShard or DeepSeek-V3), this
rank's experts of the ep group, shared experts, and the collector its routing figures go to."""
from __future__ import annotations

from functools import partial

from kernels.ep.deepseek_layer import DeepSeekMoE
from kernels.ep.layer import MoE
from kernels.ep.routing_load import ExpertLoad, token_groups
from kernels.layers import Linear, SwiGLU
from kernels.layers.base import Param
from kernels.stats import StepStats


def build_moe(cfg, prefix: str, tensors: dict, rank_ctx=None, dispatch: str | None = None,
              stats: StepStats | None = None) -> MoE:
    """The MoE layer of block `prefix` (the family cfg.moe picks: GShard here, DeepSeek-V3 in
    kernels/ep/deepseek_layer.py); with a rank context, this rank's experts of the ep group.
    It records its routing into `stats`: by default the rank context's (gathered over its dp
    group), else (no context: one process) a StepStats of its own."""
    index = int(prefix.split(".")[1])
    group, lo, local, groups = None, 0, cfg.experts, None
    if rank_ctx is not None:
        plan = rank_ctx.plan
        if plan.cp > 1:
            raise ValueError("context parallel cannot shard an MoE model (a routing group is one "
                             "whole sequence): drop cp or experts")
        group = rank_ctx.group("ep")
        groups = partial(token_groups, rank_ctx)
        local = cfg.experts // group.size
        lo = group.rank * local
        dispatch = dispatch or getattr(plan, "ep_dispatch", None)
        stats = stats or rank_ctx.stats
    ep = cfg.experts // local
    load = (stats or StepStats()).collector("moe", lambda: ExpertLoad(groups, ep))
    shard = (slice(lo, lo + local), slice(None), slice(None))

    def expert(kind):
        name = prefix + f"experts.{kind}.weight"
        full = tensors[name]                                    # [E, ...]
        prm = Param(name, full[lo:lo + local].clone(), full.shape,   # [local, ...]
                    shard if local < cfg.experts else None)
        if rank_ctx is not None:
            prm.meta["dp_group"] = "ep_dp"   # summed only over ranks holding the same experts
        return prm

    router = Param(prefix + "router.weight", tensors[prefix + "router.weight"])
    family = DeepSeekMoE if cfg.moe == "deepseek" else MoE
    moe = family(cfg, index, router, expert("w1"), expert("w3"), expert("w2"), load, group,
                 dispatch or "uneven", lo)
    if cfg.moe == "deepseek" and cfg.shared_experts:   # replicated like the router
        moe.shared = SwiGLU(*(Linear(Param(prefix + f"shared.{k}.weight",
                                           tensors[prefix + f"shared.{k}.weight"]))
                              for k in ("w1", "w3", "w2")))
    return moe
