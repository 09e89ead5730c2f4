"""partui.World, the Python API the app and the REPL share: plans, steps, inspection, traces,
failures. Multi-process: every wait is bounded."""
import os
import time

import pytest

from partui.session import PRESETS, World, engine_gap, make_plan
from kernels.mesh import PlanError

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


def test_presets_validate_or_say_what_is_missing():
    for name in PRESETS:
        gap = engine_gap(PRESETS[name][1])
        if gap is None:
            plan, cfg = make_plan(name)
            assert plan.world >= 1
        else:
            assert "not implemented yet" in gap or "fails to import" in gap
            with pytest.raises(PlanError, match="pick another preset"):
                make_plan(name)


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


def test_world_steps_shows_traces_and_recovers(tmp_path):
    gap = engine_gap({"zero": 2})
    preset = "zero2" if gap is None else "dp"
    with World(timeout_s=120) as w:
        w.plan(preset, dp=2)
        w.launch()
        pids = w.pids()
        lines = w.step(2)
        assert [ln["step"] for ln in lines] == [0, 1] and len(lines[0]["ranks"]) == 2
        assert lines[1]["loss"] < lines[0]["loss"] + 1.0
        rows = w.show(1, "optim", "layers.0.attn.wq")
        assert rows and all(r["step"] == 2 and r["state"]["m"]["norm"] > 0 for r in rows)
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
        from partui.world import RankError
        w.controller.inject_fault(0, step=3)
        with pytest.raises(RankError, match="rank 0: InjectedFault"):
            w.step(1)
        assert not w.launched
        wait_gone(pids)
        w.launch()
        assert w.step(1)[0]["step"] == 0
        pids = w.pids()
    wait_gone(pids)
