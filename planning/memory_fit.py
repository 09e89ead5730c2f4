"""The refusal of a plan whose world would not fit this machine's RAM, before anything is built
(partui.world.plans.build_plan: the CLI, the World and the app all pass there): the estimate of
planning/memory_estimate.py against MemAvailable, with fixes each re-estimated under the limit."""
from __future__ import annotations

import os
from dataclasses import replace

from planning.config import ModelConfig
from planning.memory_estimate import estimate_plan, rank_stages
from planning.mesh import Plan, PlanError

LIMIT_ENV = "PARTUI_MEMORY_LIMIT_MIB"         # overrides MemAvailable (tests; a smaller budget)


def available_bytes() -> int | None:
    """This machine's MemAvailable (/proc/meminfo), or PARTUI_MEMORY_LIMIT_MIB where set; None
    where neither can be read (no refusal then)."""
    given = os.environ.get(LIMIT_ENV)
    if given:
        try:
            mib = float(given)
        except ValueError:
            raise PlanError(f"{LIMIT_ENV}={given!r} is not a number of MiB: set it to e.g. 4096, "
                            f"or unset it to use MemAvailable") from None
        if not mib > 0 or mib == float("inf"):
            raise PlanError(f"{LIMIT_ENV}={given!r} must be a positive number of MiB: set it to "
                            f"e.g. 4096, or unset it to use MemAvailable")
        return int(mib * 2**20)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _fits(fields: dict, cfg: ModelConfig, limit: int, validate_fn) -> bool:
    try:
        plan, c = validate_fn(fields, cfg)
        c.validate()
    except (ValueError, TypeError):              # PlanError is a ValueError: not a valid plan
        return False
    return estimate_plan(plan, c)["total"] <= limit


def halvings(value: int, step: int) -> list[int]:
    """value / 2, / 4, ... rounded down to a multiple of step, each at least step, distinct."""
    out, v = [], value // 2
    while v >= step:
        cand = v // step * step
        if not out or cand < out[-1]:
            out.append(cand)
        v //= 2
    return out


def fitting_fixes(plan: Plan, cfg: ModelConfig, limit: int, validate_fn) -> list[str]:
    """Changes each of which alone makes the plan fit `limit` (field=value words), largest first:
    a smaller dim / batch / layers, or ZeRO-3 over the replicas. validate_fn(fields, cfg) -> (Plan,
    cfg) validates a candidate (planning.validate.plan_for_model)."""
    fields = plan.to_dict()
    fixes = []
    for name, step in (("dim", 2 * cfg.heads * plan.tp), ("batch", plan.dp * plan.microbatches),
                       ("layers", max(1, rank_stages(plan, 0)[1]))):
        for value in halvings(getattr(cfg, name), step):
            if _fits(fields, replace(cfg, **{name: value}), limit, validate_fn):
                fixes.append(f"{name}={value}")
                break
    if plan.zero < 3 and plan.dp * plan.cp > 1 and _fits({**fields, "zero": 3}, cfg, limit, validate_fn):
        fixes.append("zero=3")
    return fixes


def check_fits(plan: Plan, cfg: ModelConfig, validate_fn) -> None:
    """PlanError naming the estimate, the limit and fixes that fit, where the plan's world would not
    fit the memory this machine has available; before anything is built."""
    limit = available_bytes()
    if limit is None:
        return
    est = estimate_plan(plan, cfg)
    if est["total"] <= limit:
        return
    fixes = fitting_fixes(plan, cfg, limit, validate_fn)
    source = LIMIT_ENV if os.environ.get(LIMIT_ENV) else "MemAvailable"
    fix = (f"try {', or '.join(fixes)}" if fixes else
           "no smaller dim, batch or layers alone fits: shrink several, or run on a larger machine")
    raise PlanError(f"this plan needs an estimated {gib(est['total'])} (world {plan.world} x up to "
                    f"{gib(est['per_rank_peak'])} a rank: params, grads, AdamW state, activations), "
                    f"more than the {gib(limit)} this machine has available ({source}): {fix}")
