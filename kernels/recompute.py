"""Activation recompute (Plan.recompute), memory traded for compute before each block's backward.

full: a block saves only its input in the forward (kernels.block.Block.forward) and, at its
backward, runs its whole forward again to rebuild what the backward needs (span "R block i").

selective: a block keeps every matmul's output and frees what the norms and activations made,
rebuilt from the kept tensors before its backward (span "R block i", args recompute=selective).
Per dense block, of what `none` saves (kernels/memory_plan.py lists it all):
    attn_norm  xhat, rstd and its output (wq/wk/wv's input)   dropped; the block input x kept
    attention  the probabilities [B, H, S, S] (LocalAttention)  dropped; rebuilt from q and k
               q, k (after RoPE), v, o, wo's input              kept
    mlp_norm   xhat, rstd and its output (w1/w3's input)        dropped; the residual h kept
    SwiGLU     sig, act and w2's input act * h3                 dropped; rebuilt from h1, h3
               h1, h3                                           kept
A norm's output is dropped only where the branch's linears saved it itself; under sequence
parallel they saved the all-gathered copy, which is kept (rebuilding it would communicate).
Context parallel cores keep no probabilities (ring / all-gather) or drop them to the log-sum-exp
(Ulysses, whose backward recomputes them). Every rebuild runs the forward's own ops: the same
bits, so `--check` holds exactly.
"""
from __future__ import annotations

from kernels.comm import events


def slimmed(block, ctx, x, h):
    """Selective recompute: the block's saved context with its norms' and activations' tensors
    freed; it keeps the norms' inputs x and h to rebuild them (recomputed)."""
    fed_attn, fed_mlp = ctx.norm_fed
    block.attn_norm.drop_recomputable(ctx.c_n1)
    block.mlp_norm.drop_recomputable(ctx.c_n2)
    if fed_attn:
        block.attn.set_saved_input(ctx.c_a, None)
    if fed_mlp:
        block.mlp.set_saved_input(ctx.c_m, None)
    block.attn.drop_recomputable(ctx.c_a)
    block.mlp.drop_recomputable(ctx.c_m)
    ctx.x, ctx.h, ctx.slim = x, h, True        # x, h [B, S, dim]
    return ctx


def rebuild_selective(block, ctx):
    """The tensors `slimmed` freed, computed again in place (span "R block i")."""
    with events.span(f"R block {block.index}", "layer", recompute="selective"):
        n1 = block.attn_norm.rebuild_from(ctx.c_n1, ctx.x)
        n2 = block.mlp_norm.rebuild_from(ctx.c_n2, ctx.h)
        if ctx.norm_fed[0]:
            block.attn.set_saved_input(ctx.c_a, n1)
        if ctx.norm_fed[1]:
            block.mlp.set_saved_input(ctx.c_m, n2)
        block.attn.rebuild_recomputable(ctx.c_a)
        block.mlp.rebuild_recomputable(ctx.c_m)
    ctx.x = ctx.h = None
    ctx.slim = False
    return ctx


def recomputed(block, ctx):
    """The block's full context: as saved, rebuilt once from its input (full), or with its freed
    tensors rebuilt once (selective); the W of a split backward then finds it rebuilt."""
    if getattr(ctx, "slim", False):
        return rebuild_selective(block, ctx)
    if hasattr(ctx, "full"):
        return ctx.full
    if not hasattr(ctx, "x") or hasattr(ctx, "slim"):
        return ctx
    with events.span(f"R block {block.index}", "layer", recompute=True):
        _, ctx.full = block.forward(ctx.x, save_all=True)
    ctx.x = None                    # the rebuilt context holds what the backward needs
    return ctx.full


def block_forward_work(cfg, seq: int) -> dict[str, int]:
    """A dense block's forward work per sequence of `seq` tokens, by part: matmuls at 2 m n k
    operations, every elementwise result (norms, RoPE, softmax, SwiGLU, residuals) at one per
    element. The parts selective recompute runs again are the ones named `norms`, `scores`
    (Q K^T, the probabilities' matmul), `softmax` and `swiglu_act`."""
    d, hd, hidden, s = cfg.dim, cfg.head_dim, cfg.ffn_hidden, seq
    heads, kv = cfg.heads, cfg.kv_heads
    return {"qkv": 2 * s * d * hd * (heads + 2 * kv), "rope": s * hd * (heads + kv),
            "scores": 2 * heads * s * s * hd, "softmax": heads * s * s,
            "probs_v": 2 * heads * s * s * hd, "wo": 2 * s * heads * hd * d,
            "norms": 2 * (s + 2 * s * d),                 # two norms: rstd, xhat, output
            "residuals": 2 * s * d, "w1_w3": 4 * s * d * hidden,
            "swiglu_act": 3 * s * hidden, "w2": 2 * s * hidden * d}   # sig, act, act * h3


SELECTIVE_PARTS = ("norms", "scores", "softmax", "swiglu_act")


def forward_share(mode: str, cfg, seq: int) -> float:
    """The share of a block's forward work that recompute `mode` runs again before the backward:
    all of it (full), the norms, the probabilities and SwiGLU's activation (selective), none."""
    work = block_forward_work(cfg, seq)
    redo = {"none": (), "selective": SELECTIVE_PARTS, "full": tuple(work)}[mode]
    return sum(work[k] for k in redo) / sum(work.values())
