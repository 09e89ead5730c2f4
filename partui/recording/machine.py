"""The machine the lab runs on, as the trace writer records it and the analysis reads it back."""
from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def under_torchrun() -> bool:
    """Started by torchrun (its environment names this process's rank and the rendezvous)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))
