"""A rank's memory predicted by formula, before anything runs (`partui plan`): model state by the
ZeRO paper's split, and activations as the schedule's in-flight microbatches times what one
microbatch of a chunk saves for backward.

In-flight microbatches (of one chunk: a stage of the schedule) per pp rank r of P, M microbatches
(each schedule's record in planning/pipeline/catalog.py holds its own):
GPipe M; 1F1B min(P - r, M); interleaved (Megatron, v chunks) (P - r - 1) x 2 + (v - 1) x P + 1,
at most v x M; ZB1P P (1F1B's warm-up, the deferred W holding the rest); DualPipe P + 1 and
DualPipeV 2P + 1 (DualPipe's table, whose PP counts stages: 2 x ranks for DualPipeV); no pipeline 1.

Saved bytes per microbatch of b x s tokens, from what each hand-written layer keeps
(kernels/layers): a dense block keeps its two norms' xhat and rstd, their outputs (the linears'
input), q and k after RoPE, v, the attention output twice (heads and [b, s, dim] for wo), the
probabilities [b, heads, s, s], SwiGLU's h1, h3, sig, act and w2's input; the embedding its
local ids and mask; the head its norm's, lm_head's input, the shifted logits, lse and the targets
(a view: the rank's whole target batch). Under full recompute a block keeps its input only,
[b, s, dim]; under selective (kernels/recompute.py) its input and the residual h, q, k, v, o
twice, h1 and h3. Dense layers without tp / cp / sp only: elsewhere
`saved_per_microbatch` says None (not predicted).
"""
from __future__ import annotations

from kernels.block import Block
from kernels.model import Embed, Head
from planning.pipeline.catalog import in_flight

INT64, BOOL = 8, 1
LAYER_KIND = {Embed: "embed", Block: "block", Head: "head"}


def block_bytes(cfg, b: int, s: int, elem: int) -> int:
    """A dense block's saved bytes for b x s tokens (see the module docstring)."""
    t, d, hd = b * s, cfg.dim, cfg.head_dim
    hidden = cfg.ffn_hidden
    norms = 2 * (t * d + t)                          # xhat, rstd
    inputs = 2 * t * d                               # the norms' outputs: q/k/v and w1/w3 input
    attn = t * hd * (cfg.heads + 2 * cfg.kv_heads) + 2 * t * cfg.heads * hd \
        + b * cfg.heads * s * s                      # q, k, v; o twice; probabilities
    mlp = 5 * t * hidden                             # h1, h3, sig, act, w2's input
    return elem * (norms + inputs + attn + mlp)


def selective_block_bytes(cfg, b: int, s: int, elem: int) -> int:
    """A dense block's saved bytes under selective recompute (kernels/recompute.py)."""
    t, hd = b * s, cfg.head_dim
    kept = 2 * t * cfg.dim                           # the norms' inputs: the block's x and h
    attn = t * hd * (cfg.heads + 2 * cfg.kv_heads) + 2 * t * cfg.heads * hd   # q, k, v; o twice
    return elem * (kept + attn + 2 * t * cfg.ffn_hidden)                   # + h1, h3


def input_bytes(cfg, b: int, s: int, elem: int) -> int:
    """A block's saved bytes under full recompute: its input [b, s, dim]."""
    return elem * b * s * cfg.dim


BLOCK_BYTES = {"none": block_bytes, "selective": selective_block_bytes, "full": input_bytes}


def head_bytes(cfg, b: int, s: int, elem: int, batch_rows: int) -> int:
    t = b * s
    return elem * (2 * t * cfg.dim + t + t * cfg.vocab + t) + INT64 * batch_rows * s


def saved_per_microbatch(plan, cfg, chunk_layers: list[str]) -> int | None:
    """Bytes one microbatch saves in a chunk of layers ("embed", "block", "head"), or None where
    the formula does not reach (tp, cp, sequence parallel, MoE)."""
    if plan.tp > 1 or plan.cp > 1 or getattr(cfg, "experts", 0):
        return None
    elem = 2 if plan.dtype == "bf16" else 4
    rows = cfg.batch // plan.dp                      # this rank's batch rows
    b, s = rows // plan.microbatches, cfg.seq
    block = BLOCK_BYTES[plan.recompute](cfg, b, s, elem)
    per = {"embed": (INT64 + BOOL) * b * s, "block": block,
           "head": head_bytes(cfg, b, s, elem, rows)}
    return sum(per[kind] for kind in chunk_layers)


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
    per = [saved_per_microbatch(plan, cfg, [LAYER_KIND.get(type(lay), "block") for lay in ch])
           for ch in chunks]
    count = in_flight(plan.schedule, plan.pp, eng.ctx.coords["pp"], plan.microbatches,
                      plan.virtual_stages) if plan.pp > 1 else 1
    out["activation_microbatches"] = count
    out["activations"] = None if None in per else count * max(per)
    kinds = [out[k] for k in ("params", "grads", "optimizer", "gathered", "activations")]
    out["peak"] = None if None in kinds else sum(kinds)
    return out
