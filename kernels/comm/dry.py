"""A rank on paper: `dry_rank(r, n)` makes this process, which has no world, answer world_rank() r
and world_size() n, so a rank's engine can be built to read its layout (shards, stages, groups,
ledger) before anything launches (partui.world.layout, `partui plan`). Groups get no process group; an
op run inside fails loudly (no process group), it never pretends."""
from __future__ import annotations

import contextlib

import torch.distributed as dist

ON_PAPER: dict = {}   # {"rank", "size"} inside dry_rank; read by kernels.comm.core.world_rank


@contextlib.contextmanager
def dry_rank(rank: int, size: int):
    if dist.is_available() and dist.is_initialized():
        raise RuntimeError("dry_rank is for a process without a world; this one has one")
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is outside a world of {size}: pick 0..{size - 1}")
    ON_PAPER.update(rank=rank, size=size)
    try:
        yield
    finally:
        ON_PAPER.clear()
