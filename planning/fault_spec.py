"""A fault on purpose, parsed and checked in one place, torch-free: `--fault KIND@STEP:RANK` makes
rank RANK misbehave once, at step STEP, in the way KIND names, so a learner can watch the flight
recorder and `partui doctor` say what went wrong (kernels/comm/faults.py does the misbehaving).
"""
from __future__ import annotations

# kind -> what the rank does at its first eligible op of the step (the doctor's expected verdict)
KINDS = {
    "skip": "skips its first collective of the step (the others wait in it)",
    "swap": "issues its first async all-reduce of the step after the next one of another size "
            "(a swap of equal sizes is silent: only --check sees it)",
    "size": "gives its first all-reduce or broadcast of the step half the elements",
    "dtype": "gives its first all-reduce or broadcast of the step a float64 copy",
    "drop-recv": "never posts its first p2p recv of the step (the sender waits)",
    "group-order": "enters another of its groups (a barrier there) before its first collective "
                   "of the step",
    "late": "sleeps 2 s before its first collective of the step (a straggler, no fault at all)",
}
EXAMPLE = "e.g. --fault skip@1:0 (kinds: " + ", ".join(KINDS) + ")"


class FaultError(ValueError):
    """A --fault that cannot be: the message starts with the setting as typed and names a fix."""


def parse_fault(spec: str, world: int = 0, steps: int = 0) -> tuple[str, int, int] | None:
    """(kind, step, rank) of "KIND@STEP:RANK"; None for "" (no fault). world / steps, where known,
    bound the rank and the step."""
    if not spec:
        return None
    said = f"--fault {spec}"
    kind, at, where = spec.partition("@")
    step, colon, rank = where.partition(":")
    if not at or not colon:
        raise FaultError(f"{said}: give KIND@STEP:RANK, {EXAMPLE}")
    if kind not in KINDS:
        raise FaultError(f"{said}: unknown kind {kind!r}: pick one of {', '.join(KINDS)}")
    try:
        s, r = int(step), int(rank)
    except ValueError:
        raise FaultError(f"{said}: the step {step!r} and rank {rank!r} must be whole numbers, "
                         f"{EXAMPLE}") from None
    if s < 0 or (steps and s >= steps):
        top = f"0..{steps - 1}" if steps else ">= 0"
        raise FaultError(f"{said}: step {s} is outside the run's steps ({top}): pick a step in {top}")
    if r < 0 or (world and r >= world):
        top = f"0..{world - 1}" if world else ">= 0"
        raise FaultError(f"{said}: rank {r} is outside the world ({top}): pick a rank in {top}")
    return kind, s, r
