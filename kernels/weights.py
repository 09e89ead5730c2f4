"""The seeded global init: every rank draws the same full tensors and keeps its shards of them,
so any plan starts from exactly the single-process reference's weights."""
from __future__ import annotations

import zlib

import torch

from planning.config import ModelConfig, param_shapes


def init_tensor(name: str, shape: tuple, seed: int, dtype=torch.float32) -> torch.Tensor:
    """The full global tensor for `name`, the same on every rank whatever it keeps of it."""
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype)
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    std = 0.02
    if name.endswith(("wo.weight", "w2.weight")):
        std = 0.02 / 2 ** 0.5  # residual projections a little smaller
    return (torch.randn(shape, generator=g, dtype=torch.float64) * std).to(dtype)


def init_params(cfg: ModelConfig, seed: int, dtype=torch.float32) -> dict[str, torch.Tensor]:
    return {n: init_tensor(n, s, seed, dtype) for n, s in param_shapes(cfg).items()}
