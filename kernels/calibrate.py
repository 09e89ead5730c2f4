"""How fast this CPU computes, per rank, on the model's own matmuls; and the emulated link built
from it (a preset of a real cluster slowed by the same factor the compute is).

Every rank measures at the same time (so ranks sharing cores measure their share), the world
averages, and every rank installs the same link (kernels.comm.emulate).
"""
from __future__ import annotations

import time

import torch

from kernels import comm
from kernels.comm import emulate
from planning.config import ModelConfig
from planning.link import LinkModel, build_link, parse_link


def matmul_flops(cfg: ModelConfig, tokens: int, seconds: float = 0.2) -> float:
    """Achieved FLOP/s on the model's matmul shapes (tokens x dim @ dim x hidden and back, the
    attention projections), repeated for about `seconds`."""
    d, h = cfg.dim, cfg.ffn_hidden
    x, xh = torch.randn(tokens, d), torch.randn(tokens, h)
    ws = [(x, torch.randn(d, h)), (xh, torch.randn(h, d)), (x, torch.randn(d, d))]
    per_round = sum(2 * a.shape[0] * a.shape[1] * w.shape[1] for a, w in ws)
    for a, w in ws:                                            # warm the allocator
        a @ w
    rounds, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds or rounds < 3:
        for a, w in ws:
            a @ w
        rounds += 1
    return rounds * per_round / elapsed


def install_link(text: str | None, ranks_per_node: int | None, cfg: ModelConfig,
                 world: int) -> LinkModel | None:
    """Install the link `text` names on this rank (None removes it); collective over the world.
    A preset is calibrated first: every rank measures, the world averages."""
    if text is None:
        emulate.set_link(None)
        return None
    flops = 0.0
    if parse_link(text)[1] is None:                            # a preset: scaled to this machine
        tokens = max(cfg.seq, cfg.batch * cfg.seq // max(world, 1))
        mine = torch.tensor([matmul_flops(cfg, tokens)], dtype=torch.float64)
        comm.all_reduce(mine, comm.world_group(), op="avg")
        flops = float(mine.item())
    link = build_link(text, ranks_per_node, flops)
    emulate.set_link(link)
    return link
