"""A straggler on purpose: the Plan's slow_rank / slow_stage ("R=F": rank or pipeline stage R's
compute F times as long). The runner stretches each compute region it times: after the region
(t ns) the rank runs (F - 1) * t ns more of real arithmetic (small matmuls, one thread), recorded
as a compute span, so the trace shows the time as compute a slower device would have spent, and
the core is as busy as real compute keeps it (a sleep would free the core and show as idle).
The Plan is frozen, so a straggler set between steps (partui World.slow, the app's `slow`) lives
on the engine's runner: its `slow` attribute, which every runner reads per compute region.
"""
from __future__ import annotations

import torch

from kernels.comm import events

_A = None


def stretch(t0_ns: int, factor: float) -> None:
    """Run (factor - 1) x (now - t0_ns) more of real work, recorded as a compute span."""
    if factor <= 1.0:
        return
    global _A
    extra = (factor - 1.0) * (events.now_ns() - t0_ns)
    if _A is None:
        _A = torch.randn(64, 64)                                 # [64, 64]
    with events.span("straggle", "compute", factor=factor):
        end = events.now_ns() + extra
        while events.now_ns() < end:
            torch.mm(_A, _A)
