"""A rank's memory predicted by formula, before anything runs (`partui plan`): model state by the
ZeRO paper's split, and activations as the schedule's in-flight microbatches times what one
microbatch of a chunk saves for backward.

In-flight microbatches (of one chunk: a stage of the schedule) per pp rank r of P, M microbatches
(each schedule's record in planning/pipeline/catalog.py holds its own):
GPipe M; 1F1B min(P - r, M); interleaved (Megatron, v chunks) (P - r - 1) x 2 + (v - 1) x P + 1,
at most v x M; ZB1P P (1F1B's warm-up, the deferred W holding the rest); DualPipe P + 1 and
DualPipeV 2P + 1 (DualPipe's table, whose PP counts stages: 2 x ranks for DualPipeV); no pipeline 1.

Saved bytes per microbatch: the formula of planning/memory_estimate.py (torch-free, so a plan's
memory is estimated before anything is built; re-exported here). Dense layers without tp / cp / sp
only: elsewhere `saved_per_microbatch` says None (not predicted).
"""
from __future__ import annotations

from kernels.block import Block
from kernels.model import Embed, Head
from planning.memory_estimate import (BLOCK_BYTES, block_bytes, head_bytes, input_bytes,
                                      microbatch_rows, saved_per_microbatch, selective_block_bytes)
from planning.moe_memory import routing_dependent
from planning.pipeline.catalog import in_flight

__all__ = ["BLOCK_BYTES", "block_bytes", "head_bytes", "input_bytes", "predict_rank",
           "saved_per_microbatch", "selective_block_bytes"]
LAYER_KIND = {Embed: "embed", Block: "block", Head: "head"}


def layer_kind(layer) -> str:
    """The formula's name for a built layer: embed, block, moe (a block whose MLP is MoE) or head."""
    kind = LAYER_KIND.get(type(layer), "block")
    return "moe" if kind == "block" and getattr(layer, "is_moe", False) else kind


def predict_rank(eng) -> dict:
    """A built engine's (a dry one's, on paper) predicted bytes by kind and its peak: model state
    by the ledger's formula, ZeRO-3's two largest layers gathered (one in use, one prefetched),
    activations = in-flight microbatches x the heaviest chunk's saved bytes (where a rank's chunks
    differ, an upper bound). Kinds the formula does not reach are None."""
    plan, cfg = eng.plan, eng.cfg
    ledger = eng.sync.ledger()
    out = {k: ledger["formula"][k] for k in ("params", "grads", "optimizer")}
    units = sorted(u.padded * u.shard.data.element_size() for u in eng.sync.units) \
        if plan.zero == 3 else []
    out["gathered"] = sum(units[-2:])
    # without a pipeline the head's forward and backward run back to back: nothing of it waits
    chunks = [ch.layers for ch in eng.runner.chunks] if plan.pp > 1 else [eng.layers[:-1]]
    per = [saved_per_microbatch(plan, cfg, [layer_kind(lay) for lay in ch]) for ch in chunks]
    count = in_flight(plan.schedule, plan.pp, eng.ctx.coords["pp"], plan.microbatches,
                      plan.virtual_stages, plan.fb_overlap) if plan.pp > 1 else microbatch_rows(plan, cfg)[1]
    out["activation_microbatches"] = count
    out["activations"] = None if None in per else count * max(per)
    # an uneven dispatch's experts keep what the routing sends them: predicted at balanced routing
    out["balanced_routing"] = routing_dependent(cfg, plan) and any(
        layer_kind(lay) == "moe" for ch in chunks for lay in ch)
    kinds = [out[k] for k in ("params", "grads", "optimizer", "gathered", "activations")]
    out["peak"] = None if None in kinds else sum(kinds)
    return out
