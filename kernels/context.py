"""What a rank knows of the world: its plan, model config, grid coordinates, one process group per
dimension, and the per-step statistics its layers record into.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kernels import comm
from kernels.stats import StepStats
from planning.config import ModelConfig
from planning.mesh import Plan, coord_label, groups_of, partition


@dataclass
class RankContext:
    """A rank's plan, coordinates and groups; layers built with it record into `stats`."""
    plan: Plan
    cfg: ModelConfig
    rank: int
    coords: dict
    groups: dict = field(default_factory=dict)       # name -> comm.Group
    stats: StepStats = field(default_factory=StepStats)

    @property
    def label(self) -> str:
        return coord_label(self.plan, self.rank)

    def group(self, name: str) -> comm.Group:
        return self.groups[name]


def build_groups(plan: Plan) -> dict[str, comm.Group]:
    """Every rank calls this in the same order; groups of one rank make no process group."""
    return {dim: comm.new_groups(dim, partition(plan, dim)) for dim in groups_of(plan)}
