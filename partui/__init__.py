"""partui: the laboratory around `kernels` — world launcher, worker, snapshots, traces, analysis,
CLI and terminal app. `partui.World` (partui.world) is the one controller; it is light to
import (torch loads with the first plan)."""
from partui.world import World

__all__ = ["World"]
