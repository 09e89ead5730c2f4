"""Byte-level tokens from the corpus shipped with the package, deterministic per (seed, step).

Every plan draws the same global batch; data-parallel ranks take their slice of it, so the
loss of any plan is comparable with the single-process reference.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

CORPUS = Path(__file__).with_name("data") / "corpus.txt"


@lru_cache(maxsize=1)
def corpus_tokens() -> torch.Tensor:
    """The corpus as byte ids (vocab 256)."""
    return torch.frombuffer(bytearray(CORPUS.read_bytes()), dtype=torch.uint8).to(torch.int64)


def global_batch(batch: int, seq: int, vocab: int, seed: int, step: int):
    """(inputs, targets), each [batch, seq]: windows at seeded random offsets into the corpus."""
    toks = corpus_tokens()
    if vocab < 256:
        toks = toks % vocab  # a smaller vocab folds bytes onto it; still deterministic
    g = torch.Generator().manual_seed(seed * 7_919 + step)
    starts = torch.randint(0, toks.numel() - seq - 1, (batch,), generator=g)
    rows = torch.stack([toks[s:s + seq + 1] for s in starts.tolist()])  # [batch, seq + 1]
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def dp_slice(t: torch.Tensor, dp_rank: int, dp: int) -> torch.Tensor:
    """A data-parallel rank's contiguous rows of the global batch, in a storage of their own: a
    view would keep the whole global batch alive for as long as a context saves its targets."""
    n = t.shape[0]
    if n % dp:
        raise ValueError(f"global batch {n} not divisible by dp {dp}")
    k = n // dp
    return t[dp_rank * k:(dp_rank + 1) * k].clone()
