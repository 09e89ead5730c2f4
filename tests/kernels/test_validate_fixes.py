"""Property tests (hypothesis) of the plan validator's fixes, on plans up to world 8:

- every fix a rejection offers validates, or gets the plan past this problem and every earlier one;
- following the first fix offered, again and again, reaches a valid plan (at most MAX_FIXES fixes);
- the rest get advice instead of a fix ("reset the dims to 1 and add them back one at a time"):
  exactly the plans that no change of one or two fields (every field and value drawn here:
  planning.validate.BROAD, dims up to 8) validates. The advice says so; the test tries them all;
- a sample of the plans drawn here that validate (or that following fixes made valid), world <= 4,
  runs one step in a real gloo world and passes --check against the single-process reference.
"""
import io
import itertools

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from planning.config import make_config
from kernels.engine import Engine
from planning.mesh import Plan, PlanError
from planning.validate import BROAD, apply_fix, validate
from partui.world.checker import Checker
from partui.world.results import step_line
from partui.world.snapshot import step_item
from worlds import run_world

DOMAIN = BROAD   # the fields and values drawn: those the validator's last-resort search tries
LIKELY = {"world": [0, 0, 0], "dp": [0, 0], "pp": [1], "cp": [1], "ep": [1], "experts": [0],
          "zero": [0]}   # common values drawn more often
PLANS = st.fixed_dictionaries({f: st.sampled_from(LIKELY.get(f, []) + list(vs)) for f, vs in DOMAIN.items()})
MODELS = st.fixed_dictionaries({"batch": st.sampled_from([4, 6, 8, 10, 12, 16]),
                                "layers": st.sampled_from([2, 3, 4, 6, 8]),
                                "heads": st.sampled_from([2, 3, 4, 8]),
                                "seq": st.sampled_from([16, 24, 32])})
MAX_FIXES = 4
ADVICE = "add them back one at a time"


def _drawn(kw, m):
    """(Plan, ModelConfig) of a draw; dim 16 per head, kv heads half the heads when even."""
    if kw["schedule"] == "interleaved":
        kw = {**kw, "virtual_stages": 2}
    heads = m["heads"]
    plan = Plan(**kw)
    cfg = make_config("tiny", batch=m["batch"], layers=m["layers"], heads=heads, dim=16 * heads,
                      kv_heads=heads // 2 if heads % 2 == 0 else heads, seq=m["seq"])
    return plan, apply_fix(plan, cfg, {})[1]


def _validates(plan, cfg, fix: dict) -> bool:
    try:
        new_plan, new_cfg = apply_fix(plan, cfg, fix)
        new_cfg.validate()
        validate(new_plan, new_cfg, suggest=False)
    except (PlanError, ValueError):
        return False
    return True


def follow_fixes(plan, cfg):
    """(resolved plan, cfg, fixes applied) after following each rejection's first fix; the last
    PlanError when a rejection offers no fix (advice) or MAX_FIXES fixes did not get there."""
    for applied in range(MAX_FIXES + 1):
        try:
            return validate(plan, cfg), cfg, applied
        except PlanError as e:
            if not e.fixes or applied == MAX_FIXES:
                raise
            plan, cfg = apply_fix(plan, cfg, e.fixes[0])
    raise AssertionError("unreachable")


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(PLANS, MODELS)
def test_every_fix_offered_validates_or_moves_past_its_problem(kw, m):
    """Each fix a rejection offers either makes the plan valid, or gets it past this problem and
    every earlier one (a later check fails, never an earlier one: no `--microbatches 8` that batch
    10 then refuses). The message is one line either way."""
    plan, cfg = _drawn(kw, m)
    try:
        validate(plan, cfg)
    except PlanError as e:
        assert "\n" not in str(e)
        assert e.fixes or ADVICE in str(e), str(e)
        for fix in e.fixes:
            fixed_plan, fixed_cfg = apply_fix(plan, cfg, fix)
            fixed_cfg.validate()
            try:
                validate(fixed_plan, fixed_cfg, suggest=False)
            except PlanError as later:
                assert later.check > e.check, f"{fix} for {e} is refused by an earlier check: {later}"


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(PLANS, MODELS)
def test_following_fixes_reaches_a_valid_plan_or_the_advice_is_true(kw, m):
    """A rejected plan that offers a fix reaches a valid plan by following first fixes; one that
    gets advice has no change of one or two fields (any drawn field to any drawn value) that
    validates it. (Before the validator's last-resort search, `world 4 cp 4 zero 1` with experts
    got advice though `pp=2 cp=1` fixes it.)"""
    plan, cfg = _drawn(kw, m)
    try:
        follow_fixes(plan, cfg)
        return
    except PlanError as e:
        assert ADVICE in str(e) and not e.fixes, f"{MAX_FIXES} fixes did not reach a valid plan: {e}"
    singles = [{f: v} for f, vs in DOMAIN.items() for v in vs if getattr(plan, f) != v]
    pairs = [{**a, **b} for a, b in itertools.combinations(singles, 2) if set(a) != set(b)]
    assert not [f for f in singles + pairs if _validates(plan, cfg, f)], \
        f"advice for a plan some one- or two-field change fixes: {kw} {m}"


def _one_checked_step(rank, size, plan, cfg):
    buf = io.BytesIO()
    torch.save(step_item(Engine(plan, cfg, rank=rank), check=True), buf)
    return buf.getvalue()


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(PLANS, MODELS)
def test_a_drawn_sample_of_accepted_plans_runs_one_checked_step(kw, m):
    """Up to 5 drawn plans that validate (or that following fixes made valid), world <= 4, each
    one step in a real world of forked gloo ranks, held to the single-process reference."""
    plan, cfg = _drawn(kw, m)
    try:
        plan, cfg, _ = follow_fixes(plan, cfg)
    except PlanError:
        assume(False)
    assume(plan.world <= 4)
    items = [torch.load(io.BytesIO(b), weights_only=False)
             for b in run_world(plan.world, _one_checked_step, plan, cfg, timeout_s=150)]
    line = step_line(items)
    failed = Checker(plan, cfg).step(items, line)
    assert not failed and torch.isfinite(torch.tensor(line["loss"])), (plan.describe(), line)


def test_the_listed_fixes_validate_at_once():
    """The plans of the issue: their first fix makes them valid outright."""
    for kw, model in [(dict(pp=4, schedule="dualpipe", microbatches=5), dict(batch=10)),
                      (dict(dp=3, ep=3, experts=4), {}), (dict(overlap=True, dp=8, experts=4), {}),
                      (dict(overlap=True, dp=2, experts=4), dict(batch=6)),
                      (dict(tp=3), dict(dim=48, heads=3, kv_heads=3))]:
        plan, cfg = Plan(**kw), make_config("tiny", **model)
        with pytest.raises(PlanError) as e:
            validate(plan, cfg)
        for fix in e.value.fixes:
            validate(*apply_fix(plan, cfg, fix), suggest=False)
