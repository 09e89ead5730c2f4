"""partui: the laboratory around `kernels` — world launcher, worker, snapshots, traces, analysis,
CLI and terminal app. `partui.World` (partui.world.world) is the one controller; it is light to
import (torch loads with the first plan).

`partui.World` is loaded on first use (module __getattr__), so `partui report` and the other
commands that never launch a world do not pay for the controller's imports."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what linters and readers see; at run time each name loads on first use
    from partui.world.world import World

__all__ = ["World"]
_HOME = {"World": "partui.world.world"}


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'partui' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # once: later lookups find it without this hook
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
