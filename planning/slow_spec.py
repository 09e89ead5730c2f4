"""The Plan's slow_rank / slow_stage ("R=F": rank or pipeline stage R's compute F times as long), read
and checked torch-free, so a plan validates without loading torch (kernels/straggle.py does the stretching).
"""
from __future__ import annotations

from planning.field_spec import PlanError


def parse_slow(spec: str, field: str) -> tuple[int, float] | None:
    """(rank or stage, factor) of "R=F"; None for "" (off); PlanError naming the problem."""
    if not spec:
        return None
    flag = "--" + field.replace("_", "-")
    who, eq, factor = spec.partition("=")
    try:
        r, f = int(who), float(factor)
    except ValueError:
        raise PlanError(f"{flag} {spec!r}: give WHO=FACTOR, e.g. {flag} 1=1.5", field=field,
                        problem="not WHO=FACTOR") from None
    if not eq or r < 0 or not f >= 1.0:
        raise PlanError(f"{flag} {spec!r}: the index must be >= 0 and the factor >= 1 (e.g. "
                        f"{flag} 1=1.5)", field=field, problem="out of range")
    return r, f


def check_slow(plan) -> None:
    """Refuse a slow_rank outside the world or a slow_stage outside the pipeline."""
    rank = parse_slow(plan.slow_rank, "slow_rank")
    stage = parse_slow(plan.slow_stage, "slow_stage")
    if rank and plan.world and rank[0] >= plan.world:
        raise PlanError(f"--slow-rank {plan.slow_rank}: rank {rank[0]} is outside world "
                        f"{plan.world}: pick 0..{plan.world - 1}", field="slow_rank")
    if stage and stage[0] >= plan.pp:
        raise PlanError(f"--slow-stage {plan.slow_stage}: stage {stage[0]} is outside pp "
                        f"{plan.pp}: pick 0..{plan.pp - 1}", field="slow_stage")


def slow_factor(plan, rank: int, stage: int) -> float:
    """How many times as long this rank's compute runs under the Plan (1.0: not slowed)."""
    return factor_of(rank, stage, parse_slow(plan.slow_rank, "slow_rank"),
                     parse_slow(plan.slow_stage, "slow_stage"))


def factor_of(rank: int, stage: int, by_rank: tuple | None, by_stage: tuple | None) -> float:
    """The factor of the rank at (rank, pp stage) given (who, factor) pairs for a slowed rank and a
    slowed stage (None: none); both apply when both name it. The Plan's fields at launch, or a
    live setting between steps (partui World.slow, which sets the runner's `slow`)."""
    f = 1.0
    for got, who in ((by_rank, rank), (by_stage, stage)):
        if got and got[0] == who:
            f *= got[1]
    return f
