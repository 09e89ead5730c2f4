"""Launch, teardown, failure reporting (held and one-shot worlds), and the first multi-rank plan
end to end."""
import os
import signal
import time

import pytest

from conftest import check_plan, run_cli
from planning.mesh import Plan
from partui.world.controller import Controller
from partui.world.launch import RankError, WorldTimeout
from partui.world.plans import build_plan
from worlds import run_world

pytestmark = pytest.mark.timeout(240)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _tiny_plan(world, **kw):
    return build_plan("custom", "tiny", {"layers": 2}, world=world, **kw)


def test_launch_step_and_teardown_leave_no_process():
    plan, cfg = _tiny_plan(2)
    w = Controller.launch(2, timeout_s=60)
    pids = w.pids()
    assert all(_alive(p) for p in pids)
    infos = w.setup(plan, cfg)
    assert [i["label"] for i in infos] == ["dp0", "dp1"]
    out = w.step(2)
    assert len(out) == 2 and len(out[0]) == 2
    assert out[0][1]["loss"] == out[1][1]["loss"]  # the loss is global, the same on every rank
    w.close()
    deadline = time.time() + 10
    while any(_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def test_a_rank_that_raises_reaches_the_controller_with_traceback():
    plan, cfg = _tiny_plan(2)
    with Controller.launch(2, timeout_s=60) as w:
        pids = w.pids()
        w.setup(plan, cfg)
        w.step(1)
        w.inject_fault(1, step=1)
        with pytest.raises(RankError) as e:
            w.step(1)
        assert e.value.rank == 1
        assert "injected fault at step 1" in e.value.error
        assert "Traceback" in e.value.traceback and "rank.py" in e.value.traceback
        assert w.closed  # the controller tore the world down: the peer was stuck in a collective
    time.sleep(0.5)
    assert not any(_alive(p) for p in pids)


def test_a_rank_that_dies_is_reported():
    plan, cfg = _tiny_plan(2)
    with Controller.launch(2, timeout_s=60) as w:
        w.setup(plan, cfg)
        os.kill(w.pids()[0], signal.SIGKILL)
        with pytest.raises(RankError) as e:
            w.step(1)
        assert e.value.rank == 0 and "died" in str(e.value)


def test_bad_setup_reports_the_rank_and_keeps_nothing():
    _, cfg = build_plan()
    with Controller.launch(1, timeout_s=60) as w:
        with pytest.raises(RankError) as e:
            w.setup(Plan(), cfg, backward="numeric")
        assert "unknown backward 'numeric'" in e.value.error


def test_dp2_check_passes():
    s = check_plan("--dp", 2, steps=3)
    assert s["max_abs_grad_err"] < 1e-5


def test_dp4_check_passes_with_sgd():
    check_plan("--dp", 4, "--optim", "sgd", steps=2)


def test_hand_backward_and_autograd_give_the_same_run():
    a = run_cli("run", "--steps", 3, "--json", "--layers", 2, check_rc=0).lines
    b = run_cli("run", "--steps", 3, "--json", "--layers", 2, "--backward", "autograd",
                check_rc=0).lines
    for x, y in zip(a[:-1], b[:-1]):
        assert abs(x["loss"] - y["loss"]) < 1e-5


def test_loss_falls_over_50_steps():
    proc = run_cli("run", "--steps", 50, "--json", "--lr", 3e-3, check_rc=0, timeout=300)
    losses = [ln["loss"] for ln in proc.lines[:-1]]
    assert len(losses) == 50
    assert losses[-1] < losses[0] - 1.0, losses[::10]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5


def test_invalid_plan_exits_2_and_launches_nothing():
    proc = run_cli("run", "--tp", 3, "--steps", 1)
    assert proc.returncode == 2
    assert "tp 3 does not divide 4 heads" in proc.stderr
    assert "step" not in proc.stdout


@pytest.mark.parametrize("args,words", [
    (["--trace-steps", "9:12", "--trace", "traces/x.json"], "outside steps"),
    (["--trace", "/nonexistent/dir/x.json"], "does not exist"),
    (["--trace", "traces/x.txt"], ".json or .json.gz"),
    (["--capacity-factor", "0", "--experts", "4"], "capacity factor 0.0 must be > 0"),
    (["--bucket-mb", "-1", "--dp", "2"], "bucket size -1.0 must be > 0: pick --bucket-mb in 1.0, 4.0"),
    (["--model", "huge"], "unknown model preset 'huge'"),
    (["--cp", "2", "--backward", "autograd"], "autograd cannot see"),
])
def test_bad_run_flags_exit_2(args, words):
    proc = run_cli("run", "--steps", 2, *args)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr


def test_partui_run_joins_a_torchrun_world():
    import shutil
    import subprocess
    import sys
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun not installed")
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "partui",
                           "run", "--dp", "2", "--steps", "2", "--json", "--layers", "2"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json
    lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines[-1]["summary"]["backend"] == "gloo" and lines[-1]["summary"]["world"] == 2
    spawned = run_cli("run", "--dp", 2, "--steps", 2, "--json", "--layers", 2, check_rc=0).lines
    assert abs(lines[0]["loss"] - spawned[0]["loss"]) < 1e-6  # same world, same numbers


# ---------------------------------------------------------------- one-shot worlds (tests/worlds.py)

def _rank_1_hangs(rank, size, pid_dir):
    """Rank 0 answers at once; rank 1 never does (a deadlock as the launcher sees it)."""
    with open(os.path.join(pid_dir, str(rank)), "w") as f:
        f.write(str(os.getpid()))
    if rank == 1:
        time.sleep(600)
    return rank


def test_a_one_shot_world_that_deadlocks_is_killed_at_its_deadline_naming_the_silent_rank(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(WorldTimeout) as e:
        run_world(2, _rank_1_hangs, str(tmp_path), timeout_s=15, what="hanging world")
    took = time.monotonic() - t0
    assert e.value.ranks == [1]
    assert "hanging world did not finish within 15 s (rank(s) [1] gave no result" in str(e.value)
    assert 15 <= took < 25, took          # at the deadline, not at rank 1's 600 s sleep
    pids = [int((tmp_path / str(r)).read_text()) for r in range(2)]
    assert not any(_alive(p) for p in pids)   # both killed: rank 1 asleep, rank 0 in its barrier


def _results_in_rank_order(rank, size):
    time.sleep(0.2 * (size - rank))            # the last rank answers first
    return rank * 10


def test_a_one_shot_world_returns_results_in_rank_order_and_names_a_rank_that_raises():
    assert run_world(3, _results_in_rank_order, timeout_s=60) == [0, 10, 20]
    with pytest.raises(RankError) as e:
        run_world(2, _raises_on_rank_1, timeout_s=60, what="raising world")
    assert e.value.rank == 1 and "ValueError: rank 1 refuses" in e.value.error
    assert str(e.value).startswith("raising world: rank 1: ValueError")
    assert "Traceback" in str(e.value)


def _raises_on_rank_1(rank, size):
    if rank == 1:
        raise ValueError("rank 1 refuses")
    return rank
