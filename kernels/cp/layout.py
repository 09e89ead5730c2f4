"""Which tokens a cp rank holds: a contiguous block of the sequence, or the zigzag pair of chunks
r and 2N-1-r of a sequence cut into 2N chunks (so causal attention work balances over the ranks).
"""
from __future__ import annotations

import torch


def chunks_of(layout: str, n: int, rank: int) -> tuple[int, list[int]]:
    """(number of equal chunks the sequence is cut into, the chunks `rank` holds in order)."""
    if layout == "zigzag":
        return 2 * n, [rank, 2 * n - 1 - rank]
    return n, [rank]


def local_positions(seq: int, layout: str, n: int, rank: int) -> torch.Tensor:
    """True positions of the tokens `rank` holds, in the order it holds them: [seq / n]."""
    pieces, mine = chunks_of(layout, n, rank)
    if seq % pieces:
        raise ValueError(f"seq {seq} is not divisible by {pieces} chunks for cp {n} {layout}: pick "
                         f"seq a multiple of {pieces}")
    c = seq // pieces
    return torch.cat([torch.arange(i * c, (i + 1) * c) for i in mine])


def layout_of(cp_mode: str) -> str:
    """The token layout a cp mode uses: "zigzag" for zigzag, "contiguous" for every other core."""
    return "zigzag" if cp_mode == "zigzag" else "contiguous"


def sequence_shard(t: torch.Tensor, ctx) -> torch.Tensor:
    """This cp rank's tokens of a [batch, seq] tensor (ids or targets)."""
    g = ctx.group("cp")
    pos = local_positions(t.shape[1], layout_of(ctx.plan.cp_mode), g.size, g.rank)
    return t[:, pos].contiguous()                                    # [batch, seq / cp]
