"""`validate(plan, cfg)`: the resolved Plan, or PlanError naming the first problem and a fix that is
itself valid.

Each check names candidate fixes (Plan fields and model fields, most natural first); only those
under which the whole plan validates are offered, in the message (`pick tp in 1, 2, 4`, `set
microbatches=10`) and as `PlanError.fixes` (a list of {field: value}). A fix that a later check
would refuse is never suggested. Torch-free, so plans validate before anything launches.
"""
from __future__ import annotations

import math
from dataclasses import replace

from planning.config import ModelConfig, model_config_for
from planning.mesh import CP_MODES, DIMS, Plan, PlanError, fix_text
from planning.moe_families import routing_problem
from planning.pipeline.catalog import DEFAULT_SCHEDULE, SCHEDULES, least_microbatches, schedule_spec, specs

PLAN_FIELDS = set(Plan.__dataclass_fields__)
OTHER_DIMS = tuple(d for d in DIMS if d != "dp")   # the dims a world size is divided by to give dp
MAX_FIXES = 4
MAX_LISTED = 8     # `pick top_k in 1, 2, 3, 4`: a list of one field's values names every valid one
# fields whose 0 means "derive it" (the CLI refuses --world 0 and --dp 0: leave the flag out): a
# list of the field's valid values replaces a fix that only sets it to 0
DERIVED_BY_ZERO = ("world", "dp")
# the last resort of a rejection whose own candidates fix nothing: every change of one or two of
# these fields to these values (dims up to 8, the worlds this lab runs), singles first
BROAD = {"world": (0, 1, 2, 3, 4, 6, 8), "dp": (0, 1, 2, 3, 4), "tp": (1, 2, 3, 4, 8),
         "pp": (1, 2, 3, 4), "cp": (1, 2, 4), "ep": (1, 2, 3, 4), "experts": (0, 4, 6, 8),
         "zero": (0, 1, 2, 3), "sp": (False, True), "overlap": (False, True),
         "microbatches": (1, 2, 3, 4, 5, 8), "schedule": SCHEDULES, "cp_mode": CP_MODES,
         "top_k": (1, 2, 3)}
RESETS = ({"ep": 1}, {"tp": 1}, {"cp": 1}, {"pp": 1}, {"microbatches": 1}, {"overlap": False},
          {"sp": False}, {"zero": 0}, {"experts": 0})


def divisors(n: int) -> list[int]:
    """n's divisors, ascending; sqrt(n) steps, so a huge number answers at once."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0] if n > 0 else []
    return small + [n // d for d in reversed(small) if d * d != n]


def round_up(n: int, k: int) -> int:
    """The least multiple of k that is >= n (and >= k)."""
    return max(k, -(-n // k) * k)


def apply_fix(plan: Plan, cfg, fix: dict):
    """(plan, cfg) with `fix` applied: Plan fields to the plan, model fields to the config (a
    plan's experts=0 clears the model's experts too: model_config_for only ever adds them)."""
    plan_part = {k: v for k, v in fix.items() if k in PLAN_FIELDS}
    model_part = {k: v for k, v in fix.items() if k not in PLAN_FIELDS}
    if plan_part.get("experts") == 0:
        model_part["experts"] = 0
    plan = replace(plan, **plan_part)
    return plan, model_config_for(plan, replace(cfg, **model_part))


def _valid(plan: Plan, cfg, fix: dict, after: int | None = None, depth: int = 0) -> bool:
    """Whether the plan validates with `fix`; with `after` (a check's ordinal), also whether it gets
    past that check and every later problem it meets has a fix of its own (up to depth more)."""
    try:
        new_plan, new_cfg = apply_fix(plan, cfg, fix)
        new_cfg.validate()
        validate(new_plan, new_cfg, suggest=False)
    except PlanError as e:
        if after is None or depth <= 0 or e.check <= after:
            return False
        return any(_valid(new_plan, new_cfg, nxt, e.check, depth - 1)
                   for nxt in _candidates_of(new_plan, new_cfg, e.check))
    except (ValueError, TypeError):
        return False
    return True


def _candidates_of(plan: Plan, cfg, check: int) -> list[dict]:
    """The candidate fixes the check with ordinal `check` names for this plan."""
    try:
        validate(plan, cfg, collect=check)
    except PlanError as e:
        return e.candidates
    return []


def _with_world(plan: Plan, resolved: Plan, fix: dict) -> list[dict]:
    """The fix as given and, when the user fixed the world size and the fix moves a dim, the same
    fix with the world size that keeps dp where it is."""
    out = [fix]
    if plan.world and "world" not in fix and any(d in fix for d in DIMS):
        dims = {d: fix.get(d, getattr(resolved, d)) for d in DIMS}
        out.append({**fix, "world": dims["dp"] * dims["tp"] * dims["cp"] * dims["pp"]})
    return out


class _Checks:
    """need(ok, problem, candidates): raise PlanError(problem + the valid fixes) when not ok. Every
    check has an ordinal (the order it runs in), so a fix can be told to get past it."""

    def __init__(self, plan: Plan, cfg, suggest: bool, collect: int | None = None):
        self.plan, self.cfg, self.suggest, self.collect = plan, cfg, suggest, collect
        self.resolved: Plan | None = None
        self.count = 0

    def __call__(self, ok: bool, problem: str, candidates=()) -> None:
        self.count += 1
        if ok:
            return
        err = PlanError(problem)
        err.check, err.fixes, err.candidates = self.count, [], list(candidates)
        if self.collect is not None or not self.suggest or not candidates:
            raise err          # no candidates: the problem's own text names the fix
        base = self.resolved or self.plan
        one_field = len({tuple(c) for c in candidates}) == 1 and len(candidates[0]) == 1
        limit = MAX_LISTED if one_field else MAX_FIXES
        tries = [fix for cand in candidates for fix in _with_world(self.plan, base, cand)]
        both = [fix for cand in candidates for reset in RESETS if not set(reset) & set(cand)
                for fix in _with_world(self.plan, base, {**cand, **reset})]
        for pool, after in ((tries, None), (both, None), (tries, self.count), (None, None)):
            err.fixes = _first_valid(self.plan, self.cfg,
                                     broad_changes(self.plan) if pool is None else pool, after,
                                     limit if pool is tries else MAX_FIXES)
            if err.fixes:
                break
        err.args = (f"{problem}: {fix_text(err.fixes)}" if err.fixes else
                    f"{problem} (and no change of one or two fields, dims up to 8, fixes this "
                    f"plan: reset the dims to 1 and add them back one at a time)",)
        raise err


def broad_changes(plan: Plan):
    """Every change of one field of BROAD to another of its values, then of two fields."""
    singles = [{f: v} for f, values in BROAD.items() for v in values if getattr(plan, f) != v]
    yield from singles
    for i, a in enumerate(singles):
        for b in singles[i + 1:]:
            if set(a) != set(b):
                yield {**a, **b}


def _first_valid(plan: Plan, cfg, pool: list[dict], after: int | None,
                 limit: int = MAX_FIXES) -> list[dict]:
    """Up to `limit` distinct fixes of pool under which the plan validates (with `after`: gets
    past check `after` and on to a plan whose next problems have fixes)."""
    out, seen = [], set()
    for fix in pool:
        key = tuple(sorted(fix.items(), key=str))
        if key not in seen and _valid(plan, cfg, fix, after, depth=2):
            out.append(fix)
        seen.add(key)
        if len(out) == limit:
            break
    return out


def validate(plan: Plan, cfg, world: int | None = None, suggest: bool = True,
             collect: int | None = None) -> Plan:
    """The resolved plan, or PlanError naming the first problem and fixes that validate
    (`.fixes`, `.check`: the failing check's ordinal). suggest=False: no fixes (faster);
    collect: raise with the candidates of that check unverified (chained fixes use it)."""
    if world:
        plan = replace(plan, world=world)
    need = _Checks(plan, cfg, suggest, collect)   # each field's own range: checked at construction
    other = plan.tp * plan.cp * plan.pp
    if plan.world and not plan.dp:
        need(plan.world % other == 0,
             f"world {plan.world} is not divisible by tp {plan.tp} x cp {plan.cp} x pp {plan.pp} = "
             f"{other}", [{"world": other * max(1, plan.world // other)},
                          {"world": other * (plan.world // other + 1)},
                          *({d: 1} for d in OTHER_DIMS if getattr(plan, d) > 1)])
    dp = plan.dp or (plan.world // other if plan.world else plan.ep)
    total = dp * other
    need(not plan.world or plan.world == total,
         f"world {plan.world} is not the product of the dims: dp {dp} x tp {plan.tp} x cp {plan.cp} "
         f"x pp {plan.pp} = {total}", [{"world": total}] + (
             [{"dp": plan.world // other}] if plan.world % other == 0 else []) + [
             {d: 1} for d in OTHER_DIMS if getattr(plan, d) > 1])
    need.resolved = resolved = replace(plan, dp=dp, world=total)
    if not plan.microbatches:        # the Plan's default: the least the schedule takes here
        local = cfg.batch // dp if cfg.batch % dp == 0 else None
        resolved = replace(resolved, microbatches=least_microbatches(plan.schedule, plan.pp, local))
    _grid_checks(resolved, cfg, need, derived_dp=not plan.dp)
    return resolved


def _grid_checks(plan: Plan, cfg, need: _Checks, derived_dp: bool) -> None:
    b, dp = cfg.batch, plan.dp
    dp_is = f"dp {dp}" + (f" (left out: dp follows ep {plan.ep})" if derived_dp and not
                          need.plan.world and plan.ep > 1 else "")
    need(plan.zero == 0 or dp > 1,
         f"ZeRO-{plan.zero} shards over data-parallel ranks but dp = {dp}",
         [{"dp": 2}, {"dp": 4}, {"zero": 0}])
    need(b % dp == 0, f"global batch {b} is not divisible by {dp_is}",
         [{"batch": round_up(b, dp)}, *[{"dp": d} for d in divisors(b) if d > 1][::-1],
          *({"ep": d, "dp": d} for d in divisors(b) if derived_dp and d > 1)][:8])
    local = b // dp if b % dp == 0 else 1
    m = plan.microbatches
    need(local % m == 0, f"per-rank batch {local} (batch {b} / dp {dp}) is not divisible by "
                         f"{m} microbatches",
         [*({"microbatches": d} for d in sorted(divisors(local), key=lambda d: abs(d - m))),
          {"batch": dp * round_up(local, m)}])
    _tp_checks(plan, cfg, need)
    if plan.pp > 1:
        _pipeline_checks(plan, cfg, need, local)
    else:   # another schedule at pp 1 would run single, the schedule unused: a fix never says so
        need(plan.schedule == DEFAULT_SCHEDULE,
             f"schedule={plan.schedule} orders a pipeline's stages, but there is none (pp 1)"
             f"{'' if plan.schedule in SCHEDULES else ' and no such schedule'}",
             [*([{"pp": 2, "microbatches": least_microbatches(plan.schedule, 2, local)}]
                if plan.schedule in SCHEDULES else []), {"schedule": DEFAULT_SCHEDULE}])
    _cp_checks(plan, cfg, need)
    _ep_checks(plan, cfg, need, local, dp_is)


def _tp_checks(plan: Plan, cfg, need: _Checks) -> None:
    tp = plan.tp
    # a valid tp divides the heads: the model's own size bounds the search, whatever tp was asked
    tps = [{"tp": d} for d in divisors(cfg.heads) if d != tp]
    need(cfg.heads % tp == 0, f"tp {tp} does not divide {cfg.heads} heads", tps)
    need(cfg.kv_heads % tp == 0 or tp % cfg.kv_heads == 0,
         f"tp {tp} and {cfg.kv_heads} kv heads: tp must divide the kv heads (sharded) or be a "
         f"multiple of them (replicated)", tps)
    need(cfg.vocab % tp == 0, f"vocab {cfg.vocab} is not divisible by tp {tp}",
         [{"vocab": round_up(cfg.vocab, tp)},
          {"vocab": round_up(cfg.vocab, tp), "hidden": round_up(cfg.ffn_hidden, 16 * tp)}] + tps)
    need(cfg.ffn_hidden % tp == 0,
         f"MLP hidden {cfg.ffn_hidden} (from dim {cfg.dim}) is not divisible by tp {tp}",
         [{"hidden": round_up(cfg.ffn_hidden, 16 * tp)}] + tps)
    need(not plan.sp or tp > 1, "sp (sequence parallel) needs tp 2 or more",
         [{"tp": 2}, {"tp": 4}, {"sp": False}])
    pieces = plan.cp * tp
    need(not plan.sp or cfg.seq % pieces == 0,
         f"sequence parallel splits each cp rank's tokens (seq {cfg.seq} / cp {plan.cp}) over tp "
         f"{tp}: seq must be a multiple of {pieces}", [{"seq": round_up(cfg.seq, pieces)}, {"sp": False}])


def _pipeline_checks(plan: Plan, cfg, need: _Checks, local: int) -> None:
    p, m, s, dp = plan.pp, plan.microbatches, plan.stages, plan.dp
    need(cfg.layers % s == 0,
         f"{cfg.layers} layers are not divisible by {s} pipeline stages ({plan.schedule}, pp {p}"
         f"{', virtual ' + str(plan.virtual_stages) if schedule_spec(plan.schedule).virtual else ''})",
         [{"layers": round_up(cfg.layers, s)}, *({"pp": d} for d in divisors(cfg.layers)
                                                  if 1 < d < p)])
    spec = schedule_spec(plan.schedule)
    need(p % 2 == 0 or not spec.even_pp,
         f"{plan.schedule} needs an even number of pipeline ranks, got pp {p}",
         [*({"schedule": x.name} for x in specs(even_pp=False, chunks=spec.chunks)),
          {"pp": p + 1}, {"pp": max(2, p - 1)}])
    least = spec.least_count(p)                     # the rule's own words: catalog's microbatch_problem
    ok = [x for x in divisors(local) if spec.takes(p, x)]
    need(spec.takes(p, m), spec.microbatch_problem(p, m) or "",
         [*({"microbatches": x} for x in ok),
          {"microbatches": least, "batch": dp * round_up(local, least)}])
    need(not spec.virtual or plan.virtual_stages >= 2,
         f"{plan.schedule} needs virtual_stages 2 or more", [{"virtual_stages": 2}])
    need(plan.zero < 3 or spec.zero3,
         f"ZeRO-3 frees a layer's gathered weights after its backward, but {plan.schedule} defers "
         f"the weight grads (W) past it", [{"zero": 2}, {"schedule": DEFAULT_SCHEDULE}])
    virtual = [x.name for x in specs(chunks=0)]
    need(spec.virtual or plan.virtual_stages == 1,
         f"virtual_stages is for the {' and '.join(virtual)} schedule, not {plan.schedule}",
         [{"virtual_stages": 1}, *({"schedule": x} for x in virtual)])
    if plan.fb_overlap:
        capable = [x.name for x in specs(fb_overlap=True)]
        need(spec.fb_overlap,
             f"fb_overlap interleaves the F&B pairs of {', '.join(capable)}, not "
             f"{plan.schedule}", [*({"schedule": x} for x in capable), {"fb_overlap": False}])
        need(bool(plan.experts or cfg.experts),
             "fb_overlap hides the MoE all-to-all behind the other microbatch: it needs experts",
             [{"experts": 4}, {"experts": 4, "ep": 2}, {"fb_overlap": False}])
        need(plan.zero < 3, "ZeRO-3 gathers one layer's weights at a time, but fb_overlap runs two "
                            "layers' parts interleaved", [{"zero": 2}, {"fb_overlap": False}])


def _cp_checks(plan: Plan, cfg, need: _Checks) -> None:
    if plan.cp == 1:
        return
    pieces = 2 * plan.cp if plan.cp_mode == "zigzag" else plan.cp
    need(cfg.seq % pieces == 0,
         f"seq {cfg.seq} is not divisible by {pieces} ({'2 x ' if plan.cp_mode == 'zigzag' else ''}"
         f"cp {plan.cp}) for {plan.cp_mode}", [{"seq": round_up(cfg.seq, pieces)}])
    if plan.cp_mode == "ulysses":
        local_kv = cfg.kv_heads // plan.tp if cfg.kv_heads % plan.tp == 0 else 1  # per tp rank
        need(cfg.heads % (plan.cp * plan.tp) == 0 and local_kv % plan.cp == 0,
             f"Ulysses splits heads over cp {plan.cp}: {cfg.heads} heads (/ tp {plan.tp}) and "
             f"{local_kv} kv heads per tp rank must be divisible by cp",
             [{"cp_mode": "ring"}, *({"cp": d} for d in divisors(local_kv) if 1 < d < plan.cp)])


def _ep_checks(plan: Plan, cfg, need: _Checks, local: int, dp_is: str) -> None:
    experts, ep, dp = plan.experts or cfg.experts, plan.ep, plan.dp
    need(not (plan.sp and experts),
         f"sp (sequence parallel) cannot run the {experts}-expert MoE layers on sequence shards "
         f"(a routing group is one whole sequence)", [{"sp": False}, {"experts": 0}])
    need(ep == 1 or experts > 0, f"ep {ep} needs an MoE model",
         [{"experts": 2 * ep}, {"experts": ep}, {"ep": 1}])
    both = [d for d in divisors(dp) if experts and experts % d == 0 and d != ep][::-1]
    if experts:
        need(experts % ep == 0, f"{experts} experts not divisible by ep {ep}",
             [*({"ep": d} for d in both), {"experts": round_up(experts, ep)}])
        need(dp % ep == 0, f"ep {ep} must divide {dp_is} (experts are sharded over data-parallel "
                           f"ranks)", [*({"ep": d} for d in both), {"dp": ep}])
        need(1 <= plan.top_k <= experts, f"top-k {plan.top_k} must be between 1 and the {experts} "
                                         f"experts",
             [{"top_k": k} for k in range(1, min(experts, MAX_LISTED) + 1)])
    need(routing_problem(cfg) is None, routing_problem(cfg) or "")     # MoE family fields (DeepSeek)
    need(not plan.overlap or experts > 0, "overlap splits MoE all-to-all: it needs experts",
         [{"experts": 4}, {"overlap": False}])
    need(not plan.fb_overlap or plan.pp > 1,
         "fb_overlap pairs a forward with a backward inside a pipeline (without one, overlap=True "
         "interleaves two microbatches)", [{"pp": 2, "schedule": DEFAULT_SCHEDULE}, {"fb_overlap": False}])
    need(plan.recompute == "none" or not (experts or plan.fb_overlap),
         f"recompute={plan.recompute} runs (part of) a block's forward again, which MoE layers "
         f"(their routing figures) and fb_overlap's parts do not support yet",
         [{"recompute": "none"}, *([{"experts": 0}] if experts else []),
          *([{"fb_overlap": False}] if plan.fb_overlap else [])])
    need(not (experts and plan.cp > 1),
         f"MoE with context parallel (cp {plan.cp}) is not supported", [{"cp": 1}, {"experts": 0}])
    if plan.overlap and plan.pp == 1:
        pieces = 2 if plan.microbatches == 1 else plan.microbatches
        pairs = [x for x in divisors(local) if x % 2 == 0]
        need(pieces % 2 == 0 and local % pieces == 0,
             f"overlap runs microbatches in pairs: per-rank batch {local} (batch {cfg.batch} / dp "
             f"{dp}) into {pieces} microbatches does not work",
             [*({"microbatches": x} for x in pairs),
              *({"dp": d} for d in divisors(cfg.batch)[::-1] if cfg.batch // d >= 2 and d < dp),
              {"batch": dp * 2}, {"overlap": False}])


def plan_for_model(fields: dict, cfg: ModelConfig, suggest: bool = True) -> tuple[Plan, ModelConfig]:
    """(the validated Plan of these fields, the model config with its MoE fields): where a plan meets
    its model, once; the ranks trust what comes out. A field the Plan refuses at construction gets
    the fixes under which the whole plan validates, as validate's checks do."""
    try:
        plan = Plan(**fields)
    except PlanError as e:
        if e.field is None or not suggest:
            raise
        e.fixes = [fix for fix in e.candidates if _fields_valid({**fields, **fix}, cfg)][:MAX_FIXES]
        if isinstance(fields.get(e.field), int):   # the field's small values: every valid one listed
            small = [fix for fix in ({e.field: v} for v in range(1, 2 * MAX_LISTED + 1))
                     if _fields_valid({**fields, **fix}, cfg)][:MAX_LISTED]
            derived = e.field in DERIVED_BY_ZERO
            if small and (len(small) > len(e.fixes) or derived) and all(
                    fix in small or (derived and not fix[e.field]) for fix in e.fixes):
                e.fixes = small
        e.args = (f"{e.problem}: {fix_text(e.fixes)}" if e.fixes else
                  f"{e.problem}: no value of {e.field} makes this plan valid; change the others first",)
        raise
    cfg = model_config_for(plan, cfg)
    return validate(plan, cfg, plan.world or None, suggest=suggest), cfg


def _fields_valid(fields: dict, cfg: ModelConfig) -> bool:
    try:
        plan_for_model(fields, cfg, suggest=False)[1].validate()
    except (ValueError, TypeError):      # PlanError is a ValueError
        return False
    return True
