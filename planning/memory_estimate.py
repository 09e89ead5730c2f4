"""A plan's memory estimated from its sizes alone, before any tensor exists, and the refusal of a
plan whose world would not fit this machine's RAM (planning/memory_fit.py).

Per rank: params, grads and optimizer state by the ZeRO paper's split (REFERENCES.md: stage 1
shards the optimizer state, 2 the grads too, 3 the params too, over the replicas of each piece,
each layer padded to divide them), ZeRO-3's two largest gathered layers, and activations = the
schedule's in-flight microbatches (planning/pipeline/catalog.py) x the heaviest chunk's saved bytes
(the formula below). The optimizer is taken as AdamW, the default and the larger state (a plan does
not name its optimizer). Where the activation formula does not reach (tp, cp, MoE) a dense-equivalent
is used instead — the block with top_k x an expert's hidden (plus shared experts), seq / cp tokens,
over tp — marked `approximate`. The world's total is the sum over ranks: they share this machine.

Saved bytes per microbatch of b x s tokens, from what each hand-written layer keeps
(kernels/layers): a dense block keeps its two norms' xhat and rstd, their outputs (the linears'
input), q and k after RoPE, v, the attention output twice (heads and [b, s, dim] for wo), the
probabilities [b, heads, s, s], SwiGLU's h1, h3, sig, act and w2's input; the embedding its
local ids and mask; the head its norm's, lm_head's input, the shifted logits, lse and the targets
(a view: the rank's whole target batch). Under full recompute a block keeps its input only,
[b, s, dim]; under selective (kernels/recompute.py) its input and the residual h, q, k, v, o
twice, h1 and h3.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from planning.config import ModelConfig
from planning.mesh import Plan
from planning.moe_memory import moe_mlp_bytes
from planning.pipeline.catalog import in_flight, schedule_spec

INT64, BOOL = 8, 1
ADAMW_STATE_BYTES = {"fp32": 8, "bf16": 12}   # kernels/optim.py AdamW.bytes_per_element: m, v (+ master)
MODEL_STATE = ("params", "grads", "optimizer", "gathered", "activations")


# ---------------------------------------------------------------- activations (memory_plan re-exports these)

def attention_bytes(cfg, b: int, s: int, elem: int) -> int:
    """A block's saved bytes but its MLP's, for b x s tokens (see the module docstring)."""
    t, d, hd = b * s, cfg.dim, cfg.head_dim
    norms = 2 * (t * d + t)                          # xhat, rstd
    inputs = 2 * t * d                               # the norms' outputs: q/k/v and w1/w3 input
    attn = t * hd * (cfg.heads + 2 * cfg.kv_heads) + 2 * t * cfg.heads * hd \
        + b * cfg.heads * s * s                      # q, k, v; o twice; probabilities
    return elem * (norms + inputs + attn)


def block_bytes(cfg, b: int, s: int, elem: int) -> int:
    """A dense block's saved bytes: the attention's and SwiGLU's h1, h3, sig, act, w2's input."""
    return attention_bytes(cfg, b, s, elem) + elem * 5 * b * s * cfg.ffn_hidden


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


def element_bytes(plan: Plan) -> int:
    return 2 if plan.dtype == "bf16" else 4


def microbatch_rows(plan: Plan, cfg) -> tuple[int, int]:
    """(rows of one microbatch, how many microbatches a rank without a pipeline holds at once): the
    EP overlap runner cuts a rank's rows into pairs (two pieces where the plan says one) and holds a
    pair; every other runner one microbatch."""
    rows = cfg.batch // plan.dp                      # this rank's batch rows
    if plan.overlap and plan.pp == 1:
        return rows // (2 if plan.microbatches == 1 else plan.microbatches), 2
    return rows // plan.microbatches, 1


def chunk_saved_bytes(plan: Plan, cfg, chunk_layers) -> int:
    """Bytes one microbatch saves in a chunk of layers without tp / cp: the formula of the module
    docstring, an MoE block's MLP by planning/moe_memory.py. chunk_layers: its kinds ("embed",
    "block", "moe", "head") in a list, or a {kind: count} (a huge model's chunk is not listed layer
    by layer)."""
    counts = chunk_layers if isinstance(chunk_layers, dict) else Counter(chunk_layers)
    elem = element_bytes(plan)
    b, s = microbatch_rows(plan, cfg)[0], cfg.seq
    dense = BLOCK_BYTES[plan.recompute](cfg, b, s, elem)
    moe = attention_bytes(cfg, b, s, elem) + moe_mlp_bytes(cfg, plan, b * s, elem) \
        if plan.recompute == "none" else dense + elem   # full: the input and its balance loss
    per = {"embed": (INT64 + BOOL) * b * s, "block": dense, "moe": moe,
           "head": head_bytes(cfg, b, s, elem, cfg.batch // plan.dp)}
    return sum(per[kind] * n for kind, n in counts.items() if n)


def saved_per_microbatch(plan: Plan, cfg, chunk_layers) -> int | None:
    """Bytes one microbatch saves in a chunk of layers, or None where the formula does not reach
    (tp, cp, sequence parallel; MoE under selective recompute). An MoE chunk under an uneven
    dispatch is predicted at balanced routing (planning/moe_memory.routing_dependent)."""
    moe = bool(getattr(cfg, "experts", 0))
    if plan.tp > 1 or plan.cp > 1 or (moe and plan.recompute == "selective"):
        return None
    return chunk_saved_bytes(plan, cfg, chunk_layers)


def approximate_saved(plan: Plan, cfg, chunk_layers) -> int:
    """The dense-equivalent of a tp / cp / MoE chunk (module docstring): an estimate, not a prediction."""
    hidden = cfg.ffn_hidden
    if cfg.experts:
        hidden = max(hidden, cfg.expert_hidden * (cfg.top_k + cfg.shared_experts))
    dense = replace(cfg, experts=0, hidden=hidden, seq=max(1, cfg.seq // plan.cp))
    counts = Counter(chunk_layers)                   # an MoE block counted as the dense stand-in
    counts["block"] += counts.pop("moe", 0)
    return -(-chunk_saved_bytes(plan, dense, counts) // plan.tp)


# ---------------------------------------------------------------- which layers a pp rank holds

def rank_stages(plan: Plan, pp_rank: int) -> tuple[list[int], int]:
    """(the global stages a pp rank holds, in local chunk order; the number of stages), from the
    schedule's record: one chunk [r]; mirrored (DualPipe) [r, P-1-r]; V-shaped (layout "v", two
    chunks a rank: DualPipeV) r, 2P-1-r, ...; looped (interleaved) r, r + P, ..."""
    if plan.pp == 1:
        return [0], 1
    spec = schedule_spec(plan.schedule)
    p, chunks = plan.pp, spec.chunks or plan.virtual_stages
    stages = spec.stages(p, plan.virtual_stages)
    if chunks == 1:
        return [pp_rank], stages
    if spec.mirrored:
        return [pp_rank, p - 1 - pp_rank], stages
    v_shape = spec.torch_peer is not None and spec.torch_peer[1] == "v"
    return [k * p + (p - 1 - pp_rank if v_shape and k % 2 else pp_rank) for k in range(chunks)], stages


def chunk_kinds(cfg, stage: int, stages: int) -> dict[str, int]:
    """{kind: count} of a stage's layers: the embedding on the first, the head on the last; its
    blocks dense or MoE (every moe_every-th layer of an MoE model)."""
    per = cfg.layers // stages
    moe = moe_blocks(cfg, stage * per, per)
    return {"embed": int(stage == 0), "block": per - moe, "moe": moe, "head": int(stage == stages - 1)}


def moe_blocks(cfg, first: int, count: int) -> int:
    """MoE blocks among layers [first, first + count): i % moe_every == moe_every - 1."""
    if not cfg.experts:
        return 0
    return (first + count) // cfg.moe_every - first // cfg.moe_every


# ---------------------------------------------------------------- model state

def layer_elements(plan: Plan, cfg: ModelConfig, moe: bool) -> tuple[int, int]:
    """(dense elements, expert elements) of one block on one rank: tp splits attention and the dense
    MLP (kv heads replicated where tp does not divide them), ep the stacked experts; MoE layers
    are not split by tp (kernels/tp/layers.py)."""
    d, hd, tp = cfg.dim, cfg.head_dim, plan.tp
    kv = cfg.kv_heads * hd * d
    attn = 2 * cfg.heads * hd * d // tp + 2 * (kv // tp if cfg.kv_heads % tp == 0 else kv)
    if not moe:
        return 2 * d + attn + 3 * cfg.ffn_hidden * d // tp, 0
    shared = 3 * cfg.shared_experts * cfg.expert_hidden * d if cfg.moe == "deepseek" else 0
    dense = cfg.experts * d + shared                  # the router; shared experts (one wide SwiGLU)
    return 2 * d + attn + dense, 3 * cfg.experts * cfg.expert_hidden * d // plan.ep


def padded(psi: int, n: int, zero: int) -> int:
    return psi if zero == 0 else -(-psi // n) * n


def model_state(plan: Plan, cfg: ModelConfig, stages_held: list[int], stages: int) -> dict:
    """Params, grads, optimizer and ZeRO-3's gathered bytes of a rank holding these stages: one
    ZeRO unit a layer (embed, each block, the head), each padded to divide its replicas."""
    elem, k_bytes, zero = element_bytes(plan), ADAMW_STATE_BYTES[plan.dtype], plan.zero
    n_dense, n_expert = plan.dp * plan.cp, max(1, plan.dp // plan.ep)   # cp_dp and ep_dp groups
    units: list[tuple[int, int, int]] = []   # (elements, replicas, how many) per kind of unit
    per = cfg.layers // stages
    for stage in stages_held:
        if stage == 0:
            units.append((cfg.vocab * cfg.dim // plan.tp, n_dense, 1))
        moe = moe_blocks(cfg, stage * per, per)
        for is_moe, count in ((False, per - moe), (True, moe)):
            dense, expert = layer_elements(plan, cfg, is_moe)
            units += [(dense, n_dense, count)] + ([(expert, n_expert, count)] if expert else [])
        if stage == stages - 1:
            units.append((cfg.dim + cfg.vocab * cfg.dim // plan.tp, n_dense, 1))
    units = [u for u in units if u[2]]
    out = {"params": 0, "grads": 0, "optimizer": 0}
    for psi, n, count in units:
        pad = padded(psi, n, zero)
        shard = pad // n
        out["params"] += count * elem * (shard if zero == 3 else pad)
        out["grads"] += count * elem * (shard if zero >= 2 else pad)
        out["optimizer"] += count * k_bytes * (shard if zero >= 1 else pad)
    # the two largest units: the largest twice where two of its kind are held
    gathered = sorted(b for psi, n, count in units for b in [elem * padded(psi, n, zero)] * min(count, 2))
    out["gathered"] = sum(gathered[-2:]) if zero == 3 else 0
    return out


# ---------------------------------------------------------------- the estimate

def estimate_rank(plan: Plan, cfg: ModelConfig, pp_rank: int) -> dict:
    """One pp rank's estimated bytes by kind (every rank of the same pp coordinate holds the same),
    `peak` their sum, `approximate` where the activations are the dense-equivalent."""
    held, stages = rank_stages(plan, pp_rank)
    out = model_state(plan, cfg, held, stages)
    # without a pipeline the head's forward and backward run back to back: nothing of it waits
    chunks = [chunk_kinds(cfg, s, stages) for s in held] if plan.pp > 1 else \
        [{**chunk_kinds(cfg, 0, 1), "head": 0}]
    exact = [saved_per_microbatch(plan, cfg, ch) for ch in chunks]
    out["approximate"] = None in exact
    per = [approximate_saved(plan, cfg, ch) for ch in chunks] if out["approximate"] else exact
    count = in_flight(plan.schedule, plan.pp, pp_rank, plan.microbatches, plan.virtual_stages,
                      plan.fb_overlap) \
        if plan.pp > 1 else microbatch_rows(plan, cfg)[1]
    out["activation_microbatches"] = count
    out["activations"] = count * max(per)
    out["peak"] = sum(out[k] for k in MODEL_STATE)
    return out


def estimate_plan(plan: Plan, cfg: ModelConfig) -> dict:
    """{"ranks": one estimate per pp rank, "per_rank_peak": the heaviest, "total": the world's sum}."""
    ranks = [estimate_rank(plan, cfg, r) for r in range(plan.pp)]
    others = plan.world // plan.pp                   # the ranks sharing each pp coordinate
    return {"ranks": ranks, "per_rank_peak": max(r["peak"] for r in ranks),
            "total": others * sum(r["peak"] for r in ranks)}
