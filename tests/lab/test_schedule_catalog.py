"""The schedule catalogue (planning/pipeline/catalog.py): each record agrees with the schedule its
builder makes; a schedule registered in one place reaches run, simulate, plan and the app; run,
simulate and the app accept and refuse the same microbatch counts in the same words; the Plan's
own microbatches default is the same wherever a plan is made."""
from __future__ import annotations

import contextlib
import json
from dataclasses import replace

import pytest

from partui.app.screens.setup import check_plan, defaults, form_specs
from partui.app.widgets.command_line import parse
from partui.world.plans import build_plan
from partui.world.world import World
from planning.field_spec import PlanError
from planning.mesh import Plan, groups_of
from planning.pipeline.catalog import (CATALOG, build_schedule, count_accumulations, formula_bubble,
                                       register_schedule, schedule_spec, unregister_schedule)
from planning.pipeline.schedules import check_schedule
from planning.pipeline.simulate import Cost, simulate
from tests.conftest import run_here


@pytest.mark.parametrize("name,pp,m,stages,chunks,accumulations", [
    ("gpipe", 2, 4, 2, 1, [4]), ("1f1b", 2, 4, 2, 1, [4]), ("interleaved", 2, 4, 4, 2, [4, 4]),
    ("zb1p", 3, 3, 3, 1, [3]), ("dualpipe", 2, 4, 2, 2, [2, 2]), ("dualpipev", 2, 5, 4, 2, [5, 5])])
def test_each_record_matches_the_schedule_it_builds(name, pp, m, stages, chunks, accumulations):
    spec = schedule_spec(name)
    s = build_schedule(name, pp, m)
    check_schedule(s)
    assert (s.name, s.stages, s.chunks_per_rank, s.split_w, s.directions) == \
        (name, stages, chunks, spec.split_w, spec.directions)
    assert spec.stages(pp, s.chunks_per_rank) == stages == Plan(pp=pp, schedule=name, virtual_stages=(
        chunks if spec.virtual else 1)).stages
    for rank in range(pp):
        assert [spec.accumulations(s, rank, c) for c in range(chunks)] == accumulations


def test_accumulations_count_the_backward_half_of_an_fb_pair():
    s = build_schedule("1f1b", 2, 4, fb_overlap=True)
    assert any(a.kind == "FB" for a in s.actions[0])
    assert [count_accumulations(s, r, 0) for r in range(2)] == [4, 4]


def test_only_the_mirrored_schedule_has_the_pp_mirror_group():
    mirrored = [n for n in CATALOG if "pp_mirror" in groups_of(Plan(pp=2, schedule=n, microbatches=4))]
    assert mirrored == ["dualpipe"]


def test_dualpipev_takes_an_odd_count_as_deepseeks_does():
    """DeepSeek's DualPipeV.step asserts only num_chunks >= 2 x ranks (DualPipe's also asks it even)."""
    s = build_schedule("dualpipev", 2, 5)
    check_schedule(s)
    cost = Cost(F=1, B=2, W=1)
    result = simulate(s, cost)
    # each rank runs 2 chunks x 5 microbatches of F + B, and idles the published bubble only
    assert result.busy == [30.0, 30.0]
    assert result.makespan == 30.0 + formula_bubble("dualpipev", 2, cost)[0] == 32.0
    with pytest.raises(ValueError, match="dualpipe needs an even number of microbatches >= 2 x pp = 4"):
        build_schedule("dualpipe", 2, 5)


def test_dualpipev_runs_an_odd_count_under_check():
    r = run_here("run", "--pp", 2, "--schedule", "dualpipev", "--microbatches", 5, "--batch", 10,
                 "--layers", 4, "--steps", 1, "--check", "--json")
    assert r.returncode == 0, r.stderr[-2000:]


def _app_plan(words: str) -> Plan:
    """The plan the app makes of `:plan custom WORDS`: its grammar, then World.plan, as
    partui.app.screens.commands does."""
    fields = parse(f":plan custom {words}").args["fields"]
    return World().plan("custom", fields.pop("model", "tiny"), **fields)


def _app_problem(words: str) -> str:
    """The app's refusal of `:plan custom WORDS` ('' when it takes the plan)."""
    try:
        _app_plan(words)
    except PlanError as e:
        return str(e)
    return ""


@pytest.mark.parametrize("schedule,m,batch,problem", [
    ("dualpipev", 3, 6, "dualpipev needs microbatches >= 2 x pp = 4"),
    ("dualpipev", 5, 10, None), ("dualpipev", 4, 8, None),
    ("dualpipe", 5, 10, "dualpipe needs an even number of microbatches >= 2 x pp = 4"),
    ("dualpipe", 6, 12, None)])
def test_run_simulate_and_the_app_take_the_same_counts_in_the_same_words(schedule, m, batch, problem):
    flags = ["--pp", 2, "--schedule", schedule, "--microbatches", m]
    planned = run_here("plan", *flags, "--batch", batch, "--layers", 4, "--json")
    simulated = run_here("simulate", *flags)
    app = _app_problem(f"pp=2 schedule={schedule} microbatches={m} batch={batch} layers=4")
    if problem is None:
        assert (planned.returncode, simulated.returncode, app) == (0, 0, ""), planned.stderr
        assert json.loads(planned.stdout)["plan"]["microbatches"] == m
        return
    assert (planned.returncode, simulated.returncode) == (2, 2)
    for said in (planned.stderr, simulated.stderr, app):
        assert f"{problem} (DeepSeek's" in said and f", got {m}" in said, said


def test_the_default_microbatches_are_the_plans_own():
    cli = json.loads(run_here("plan", "--pp", 2, "--json").stdout)["plan"]["microbatches"]
    world = World().plan("custom", pp=2).microbatches
    app = _app_plan("pp=2").microbatches
    form = check_plan({**defaults(), "pp": 2}, "tiny")[0].microbatches
    assert cli == world == app == form == 2
    assert build_plan("custom", "tiny", pp=2, schedule="dualpipev")[0].microbatches == 4
    assert build_plan("custom", "tiny", {"batch": 6, "layers": 6}, pp=3)[0].microbatches == 3
    assert build_plan("custom", "tiny", {"batch": 8, "layers": 6}, pp=3)[0].microbatches == 4


@contextlib.contextmanager
def throwaway_schedule():
    """1F1B's generator under a new name that needs one microbatch more than pp."""
    spec = replace(schedule_spec("1f1b"), name="throwaway", description="a test's throwaway",
                   least=lambda p: p + 1, least_text="pp + 1",
                   microbatch_source="the throwaway's own rule", preset_label="PP throwaway",
                   torch_peer=None)
    register_schedule(spec)
    try:
        yield spec
    finally:
        unregister_schedule("throwaway")


def test_a_schedule_registered_in_one_place_is_seen_everywhere():
    with throwaway_schedule():
        assert "throwaway" in run_here("run", "--help").stdout
        sim = run_here("simulate", "--schedule", "throwaway", "--pp", 2, "--microbatches", 3)
        assert sim.returncode == 0, sim.stderr
        assert sim.stdout.startswith("throwaway: pp 2, microbatches 3")
        assert "formula (P-1)(F+B) = 3" in sim.stdout
        planned = run_here("plan", "--pp", 2, "--schedule", "throwaway", "--layers", 4)
        assert planned.returncode == 0, planned.stderr
        assert "microbatches 4 (not given: the least throwaway takes" in planned.stdout
        doc = json.loads(run_here("plan", "--pp", 2, "--schedule", "throwaway", "--layers", 4,
                                  "--json").stdout)
        assert [r["predicted"]["activation_microbatches"] for r in doc["ranks"]] == [2, 1]
        assert parse(":plan custom schedule=throwaway pp=2").args["fields"]["schedule"] == "throwaway"
        assert "throwaway" in next(s for s in form_specs() if s.name == "schedule").choices
        problem = "throwaway needs microbatches >= pp + 1 = 3 (the throwaway's own rule), got 2"
        for said in (run_here("plan", "--pp", 2, "--schedule", "throwaway", "--microbatches", 2).stderr,
                     run_here("simulate", "--schedule", "throwaway", "--pp", 2, "--microbatches", 2).stderr,
                     _app_problem("pp=2 schedule=throwaway microbatches=2")):
            assert problem in said, said
    assert run_here("plan", "--pp", 2, "--schedule", "throwaway").returncode == 2
    assert "throwaway" not in run_here("run", "--help").stdout


def test_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="schedule name 'zero-bubble' is taken"):
        register_schedule(replace(schedule_spec("1f1b"), name="zero-bubble"))
