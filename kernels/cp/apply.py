"""The entry points of context parallelism: the attention core of a cp mode, and a model's Blocks
switched over to it (RoPE tables at this rank's true positions)."""
from __future__ import annotations

from kernels import comm
from kernels.block import Block
from kernels.cp.attention_cost import AttentionLoad
from kernels.cp.layout import layout_of, local_positions
from kernels.cp.ring import AllGatherAttention, RingAttention
from kernels.cp.ulysses import UlyssesAttention
from kernels.layers import rope_tables
from kernels.stats import StepStats

CORE_MODES = ("ring", "zigzag", "ulysses", "allgather")


def make_core(mode: str, group: comm.Group, seq: int, stats: StepStats, layer: int = 0):
    """The attention core of `mode` for this rank of the cp `group`; it records its load into
    `stats` (the rank context's)."""
    if mode not in CORE_MODES:
        raise ValueError(f"unknown cp core {mode!r}: pick one of {', '.join(CORE_MODES)}")
    load = stats.collector("attention", AttentionLoad)
    if mode == "ulysses":
        return UlyssesAttention(group, seq, load, layer)
    if mode == "allgather":
        return AllGatherAttention(group, seq, load, layer)
    return RingAttention(group, seq, load, mode, layer)


def apply_context_parallel(layers: list, ctx, mode: str | None = None) -> None:
    """Give every Block's attention the cp core and RoPE tables at this rank's true positions.
    `mode` overrides the plan's cp mode (the benchmark swaps in the all-gather baseline; it
    keeps the contiguous layout, so only ring-layout plans may switch to it)."""
    mode = mode or ctx.plan.cp_mode
    if mode == "allgather" and ctx.plan.cp_mode == "zigzag":
        raise ValueError("the all-gather core expects the contiguous layout: build the plan with "
                         "cp_mode=ring, then switch to allgather")
    g, cfg = ctx.group("cp"), ctx.cfg
    pos = local_positions(cfg.seq, layout_of(mode), g.size, g.rank)              # [S/N]
    for layer in layers:
        if not isinstance(layer, Block):
            continue
        attn = layer.attn
        like = attn.cos                        # keep the tables' dtype and device
        cos, sin = rope_tables(pos, cfg.head_dim, cfg.rope_theta, like.dtype)  # [S/N, hd]
        attn.cos, attn.sin = cos.to(like.device), sin.to(like.device)
        attn.core = make_core(mode, g, cfg.seq, ctx.stats, layer.index)
