"""Full activation recompute (Plan.recompute = "full"): a block saves only its input in the
forward (kernels.model.Block.forward) and, at its backward, runs its forward again to rebuild
what the backward needs: memory traded for one more forward per block, shown as its own span.
"""
from __future__ import annotations

from kernels.comm import events


def recomputed(block, ctx):
    """The block's full context: as saved, or rebuilt once from its input (span "R block i";
    the W of a split backward then finds it rebuilt)."""
    if hasattr(ctx, "full"):
        return ctx.full
    if not hasattr(ctx, "x"):
        return ctx
    with events.span(f"R block {block.index}", "layer", recompute=True):
        _, ctx.full = block.forward(ctx.x, save_all=True)
    ctx.x = None                    # the rebuilt context holds what the backward needs
    return ctx.full
