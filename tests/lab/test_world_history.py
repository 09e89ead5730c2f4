"""World's step history is bounded (its last history_lines lines) with running totals: every reader
of the history keeps its behaviour past the bound — step numbers, the summary's step count, mean
step, first loss, check and memory peak, the app's losses, the routing of a traced window."""
import gzip
import json

import pytest

from partui.app.screens.run import LOSS_POINTS
from partui.app.widgets.routing_map import SPARK_STEPS
from partui.world.results import StepTotals, summarize
from partui.world.world import HISTORY_LINES, LOSSES_KEPT, World
from planning.config import ModelConfig
from planning.mesh import Plan

pytestmark = pytest.mark.timeout(600)


def line(step, loss, ms, peak, **extra):
    return {"step": step, "loss": loss, "step_ms": ms,
            "memory": [{"peak": peak, "rank": 0}, {"peak": 100 - peak, "rank": 1}], **extra}


LINES = [line(0, 5.0, 90.0, 10, grad_sync_overlap=0.5, attn_ms=[1.0, 3.0]),
         line(1, 4.0, 10.0, 40, grad_sync_overlap=0.25, attn_ms=[2.0, 4.0], max_abs_grad_err=1e-6),
         line(2, 3.0, 20.0, 30, grad_sync_overlap=0.75, attn_ms=[4.0, 8.0], max_abs_grad_err=3e-6,
              check="failed"),
         line(3, 2.0, 30.0, 20, grad_sync_overlap=0.5, attn_ms=[6.0, 0.0], max_abs_grad_err=2e-6)]


def test_totals_of_every_step_give_the_summary_of_every_line_from_the_last_line_alone():
    plan, cfg = Plan(dp=2), ModelConfig()
    whole = summarize(plan, cfg, [], LINES, 0.0, checked=True)
    bounded = summarize(plan, cfg, [], LINES[-1:], 0.0, checked=True, totals=StepTotals.of(LINES))
    assert whole == bounded
    assert bounded["steps"] == 4 and bounded["first_loss"] == 5.0 and bounded["final_loss"] == 2.0
    assert bounded["mean_step_ms"] == 20.0                  # steps 1..3: the warm-up left out
    assert bounded["check"] == "failed" and bounded["max_abs_grad_err"] == 3e-6
    assert bounded["grad_sync_overlap"] == 0.5
    assert bounded["attn_ms"] == [4.0, 4.0]
    assert [m["peak"] for m in bounded["memory_peak"]] == [40, 90]   # step 1's, step 0's


def test_one_step_is_its_own_mean():
    s = summarize(Plan(dp=2), ModelConfig(), [], LINES[:1], 0.0)
    assert s["steps"] == 1 and s["mean_step_ms"] == 90.0 and s["attn_ms"] == [1.0, 3.0]


def test_a_world_keeps_at_least_one_line():
    with pytest.raises(ValueError, match="history_lines >= 1"):
        World(history_lines=0)


def test_the_default_bounds_hold_what_the_app_draws():
    assert HISTORY_LINES >= SPARK_STEPS and LOSSES_KEPT >= LOSS_POINTS


def test_a_world_run_past_its_bound_numbers_and_summarises_every_step():
    with World(history_lines=3) as w:
        w.plan("dp", dp=2, layers=1)
        lines = w.step(2) + w.run(3)
        assert [ln["step"] for ln in lines] == [0, 1, 2, 3, 4]    # numbering goes on past the bound
        assert w.steps_done == 5 and repr(w).endswith("step 5)")
        assert [ln["step"] for ln in w.history] == [2, 3, 4]
        assert ["ledgers" in ln for ln in w.history] == [False, False, True]
        assert w.losses() == [ln["loss"] for ln in lines]       # past the lines: LOSSES_KEPT
        s = w.summary()
    times = [ln["step_ms"] for ln in lines[1:]]
    assert s["steps"] == 5 and s["mean_step_ms"] == sum(times) / len(times)
    assert s["first_loss"] == lines[0]["loss"] and s["final_loss"] == lines[-1]["loss"]
    assert s["memory_peak"] == [max(col, key=lambda m: m["peak"])
                                for col in zip(*(ln["memory"] for ln in lines))]


def test_a_traced_window_longer_than_the_history_keeps_every_steps_routing(tmp_path):
    with World(timeout_s=300, history_lines=1) as w:
        w.plan("deepseek", ep=2, dp=2)
        w.step(1)
        w.trace_on()
        lines = w.step(3)
        path = w.trace_save(str(tmp_path / "moe.json.gz"), command="test")
    meta = json.load(gzip.open(path))["metadata"]
    assert meta["steps"] == [1, 3]
    assert meta["routing"] == {str(ln["step"]): json.loads(json.dumps(ln["moe_layers"]))
                               for ln in lines}
