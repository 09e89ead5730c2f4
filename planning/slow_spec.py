"""A straggler on purpose, parsed and checked in one place, torch-free (so a plan validates without
loading torch; kernels/straggle.py does the stretching): the Plan's slow_rank / slow_stage ("R=F":
rank or pipeline stage R's compute F times as long), the app's `slow R=F` / `slow stage S=F`
(partui.app.widgets.command_line) and World.slow's keywords (partui.world.world).
"""
from __future__ import annotations

from planning.field_spec import PlanError

# the Plan field -> what its index counts, and the dimension bounding it
WHO = {"slow_rank": ("rank", "world"), "slow_stage": ("stage", "pp")}


def parse_slow(spec: str, field: str, said: str = "") -> tuple[int, float] | None:
    """(rank or stage, factor) of "R=F"; None for "" (off); PlanError naming the problem. `said`:
    how the user wrote the setting, for the messages (default the flag: --slow-rank)."""
    if not spec:
        return None
    said = said or flag_of(field)
    who, example = WHO[field][0], f"give WHO=FACTOR, e.g. {said} 1=1.5"
    index, eq, factor = spec.partition("=")
    if not eq:
        raise PlanError(f"{said} {spec!r}: {example}", field=field, problem="not WHO=FACTOR")
    try:
        r = int(index)
    except ValueError:
        raise PlanError(f"{said} {spec!r}: the {who} {index!r} is not a whole number: {example}",
                        field=field, problem="not WHO=FACTOR") from None
    try:
        f = float(factor)
    except ValueError:
        raise PlanError(f"{said} {spec!r}: the factor {factor!r} is not a number: {example}",
                        field=field, problem="not WHO=FACTOR") from None
    check_straggler(field, r, f, f"{said} {spec}")
    return r, f


def check_straggler(field: str, index: int, factor: float, said: str, top: int = 0) -> None:
    """Refuse a straggler that cannot be: a factor below 1, an index below 0 or, where its
    dimension's size `top` is known (the world for a rank, pp for a stage), past it. `said`: the
    setting as the user wrote it, which the message starts with."""
    who, dim = WHO[field]
    if not factor >= 1.0:
        raise PlanError(f"{said}: the factor {factor:g} must be >= 1: a straggler runs its compute "
                        f"factor >= 1 times as long, e.g. 1.5", field=field, problem="out of range")
    if index < 0 and not top:
        raise PlanError(f"{said}: the {who} {index} must be >= 0", field=field, problem="out of range")
    if top and not 0 <= index < top:
        raise PlanError(f"{said}: {who} {index} is outside 0..{top - 1} ({dim} {top}): pick a {who} "
                        f"in 0..{top - 1}", field=field, problem="out of range")


def check_slow(plan) -> None:
    """Refuse a slow_rank outside the world or a slow_stage outside the pipeline."""
    for field, top in (("slow_rank", plan.world), ("slow_stage", plan.pp)):
        spec = getattr(plan, field)
        got = parse_slow(spec, field)
        if got:
            check_straggler(field, got[0], got[1], f"{flag_of(field)} {spec}", top)


def flag_of(field: str) -> str:
    """The CLI flag of a slow field: slow_rank -> --slow-rank."""
    return "--" + field.replace("_", "-")


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
