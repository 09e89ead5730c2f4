"""partui.World, the one controller `partui run`, the app and the REPL drive: plans (partui.world.plans),
steps, the check, inspection, traces, the summary, failures. Multi-process: every wait is bounded."""
import gzip
import json
import os
import time

import pytest

from planning.mesh import PlanError
from partui.world.launch import RankError
from partui.world.plans import PRESETS, build_plan, preset_fields
from partui.world.world import World

pytestmark = pytest.mark.timeout(300)


def alive(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read()
    except FileNotFoundError:
        return False


def wait_gone(pids, timeout=10.0):
    t0 = time.monotonic()
    while any(alive(p) for p in pids):
        assert time.monotonic() - t0 < timeout, f"processes left: {[p for p in pids if alive(p)]}"
        time.sleep(0.1)


def test_every_preset_builds():
    for name in PRESETS:
        plan, cfg = build_plan(name)
        assert plan.world >= 1 and cfg.dim > 0


def test_interleaved_defaults_to_two_virtual_stages_and_an_explicit_one_is_refused():
    assert preset_fields(schedule="interleaved", pp=2)["virtual_stages"] == 2
    assert preset_fields("interleaved")["virtual_stages"] == 2
    assert "virtual_stages" not in preset_fields(schedule="1f1b", pp=2)
    plan, _ = build_plan(pp=2, schedule="interleaved", microbatches=4)
    assert plan.virtual_stages == 2
    with pytest.raises(PlanError, match="virtual"):
        build_plan(pp=2, schedule="interleaved", microbatches=4, virtual_stages=1)


def test_model_overrides_and_moe_fields_reach_the_config():
    plan, cfg = build_plan("gshard", "tiny", {"layers": 2})
    assert cfg.layers == 2 and cfg.experts == plan.experts == 4


def test_bad_plans_name_the_problem():
    w = World()
    with pytest.raises(PlanError, match="tp 3 does not divide 4 heads"):
        w.plan("tp", tp=3)
    with pytest.raises(PlanError, match="unknown preset 'zero9'"):
        w.plan("zero9")
    with pytest.raises(PlanError, match="plan fields are"):
        w.plan("dp", bogus=1)
    with pytest.raises(RuntimeError, match="no plan yet"):
        w.launch()
    with pytest.raises(ValueError, match="steps must be >= 1"):
        w.step(0)
    with pytest.raises(PlanError, match="autograd cannot see"):
        World(backward="autograd").plan("1f1b")


def test_world_steps_shows_traces_and_recovers(tmp_path):
    with World(timeout_s=120) as w:
        w.plan("zero2", dp=2)
        w.launch()
        pids = w.pids()
        lines = w.step(2)
        assert [ln["step"] for ln in lines] == [0, 1] and len(lines[0]["ranks"]) == 2
        assert lines[1]["loss"] < lines[0]["loss"] + 1.0
        rows = w.show(1, "optim", "layers.0.attn.wq")
        assert rows and all(r["step"] == 2 and r["state"]["m"]["norm"] > 0 for r in rows)
        assert list(rows.to_pandas()["m_norm"]) == [r["state"]["m"]["norm"] for r in rows]
        assert len(repr(rows).splitlines()) == len(rows) + 2   # title, header, a line per tensor
        assert w.show(1, "optimizer", "layers.0.attn.wq") == rows  # an alias (partui.world.show_kinds)
        with pytest.raises(ValueError, match="show 'shards': pick one of params, grad, optim"):
            w.show(1, "shard")
        frame = lines.to_pandas()   # one row per step and rank
        assert list(frame["loss"]) == [ln["loss"] for ln in lines for _ in ln["ranks"]]
        with pytest.raises(ValueError, match="outside the world of 2"):
            w.show(5)
        with pytest.raises(ValueError, match="no parameter matching"):
            w.show(0, "grad", "nonexistent")
        w.trace_on()
        w.step(1)
        path = w.trace_save(str(tmp_path / "s.json"))
        assert os.path.isfile(path)
        rep = w.report(by="rank")
        assert list(rep["rank"]) == [0, 1] and (rep["compute_ms"] > 0).all()
        by_step = w.report(by="step")
        assert set(by_step["step"]) == {2.0}
        # a rank that raises: RankError naming it, the world is dropped, launch() brings it back
        w.controller.inject_fault(0, step=3)
        with pytest.raises(RankError, match="rank 0: InjectedFault"):
            w.step(1)
        assert not w.launched
        wait_gone(pids)
        w.launch()
        assert w.step(1)[0]["step"] == 0
        pids = w.pids()
    wait_gone(pids)


def test_checked_world_runs_traced_windows_and_summarises(tmp_path):
    """What `partui run --check --trace --trace-steps 1:3` does, through the API."""
    with World(timeout_s=120, check=True) as w:
        w.plan("dp", dp=2, layers=2)
        w.launch()
        seen = []
        lines = w.run(4, on_step=seen.append, trace_steps={1, 2})
        assert seen == lines and [ln["step"] for ln in lines] == [0, 1, 2, 3]
        assert all(ln["max_abs_grad_err"] < 2e-5 and "check" not in ln for ln in lines)
        assert not w.recording and not w.failed
        path = w.trace_save(str(tmp_path / "run.json.gz"), command="test")
        s = w.summary()
    assert s["check"] == "passed" and s["steps"] == 4 and s["trace"] == path
    assert s["model"]["layers"] == 2 and [r["label"] for r in s["ranks"]] == ["dp0", "dp1"]
    meta = json.load(gzip.open(path))["metadata"]
    assert meta["steps"] == [1, 2] and meta["command"] == "test" and meta["cpus"] >= 1
    t0, t1 = meta["window_us"]
    assert t1 > t0


def test_history_keeps_every_ranks_row_and_ledger_for_the_newest_step_only():
    with World() as w:
        w.plan("dp", dp=2, layers=1)
        lines = w.step(3)
        assert all("ledgers" in ln for ln in lines)             # what the caller gets is whole
        w.step(1)
        assert ["ledgers" in ln for ln in w.history] == [False, False, False, True]
        assert ["ranks" in ln for ln in w.history] == [False, False, False, True]
        assert [ln["step"] for ln in w.history] == [0, 1, 2, 3] and w.losses()[:3] == [
            ln["loss"] for ln in lines]
        assert w.summary()["ranks"][1]["ledger"] == w.history[-1]["ledgers"][1]
