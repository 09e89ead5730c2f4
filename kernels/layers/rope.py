"""Rotary position embedding (rotate-half form). Positions are explicit so context-parallel
layouts (zigzag) rotate each token by its true position."""
from __future__ import annotations

import torch


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float = 10000.0, dtype=torch.float32):
    """cos, sin of shape [seq, head_dim] for the given integer positions [seq]."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [seq, head_dim/2]
    ang = torch.cat([ang, ang], dim=-1)                              # [seq, head_dim]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x, cos, sin):
    """x [batch, heads, seq, head_dim]; cos/sin [seq, head_dim]."""
    return x * cos + _rotate_half(x) * sin


def apply_rope_backward(dy, cos, sin):
    """The rotation is orthogonal, so its transpose is the rotation by -angle."""
    return dy * cos - _rotate_half(dy) * sin
