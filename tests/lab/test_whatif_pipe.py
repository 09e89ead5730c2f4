"""`partui whatif --pp / --microbatches`: the schedule simulator under a hand-built pipeline
trace's compute, with a known answer, and the changes a plan cannot take (exit 2, one line)."""
import json
from dataclasses import asdict

import pytest

from planning.config import ModelConfig
from planning.link import build_link
from planning.mesh import Plan
from partui.analysis.replay.whatif_pipe import repipe

PLAN = {"pp": 2, "schedule": "1f1b", "microbatches": 2, "dp": 1, "world": 2}
MODEL = {"layers": 4, "batch": 8}


def X(pid, name, cat, ts_ms, dur_ms, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": 1, "ts": ts_ms * 1e3,
            "dur": dur_ms * 1e3, "args": args}


def pipeline_doc():
    """pp 2, 1F1B, 2 microbatches, one step of 10 ms per rank: every F action 1 ms, every BW 2 ms,
    one 100 kB activation send per forward; the pipeline's actions end at 9 ms (1 ms of rest)."""
    ev = []
    for r in (0, 1):
        ev += [{"ph": "M", "name": "thread_name", "pid": r, "tid": t, "args": {"name": n}}
               for t, n in ((1, "compute"), (2, "comm"))]
        ev.append(X(r, "step", "step", 0, 10, step=0))
    t = {0: [(0, "F", 0), (1, "F", 1), (5, "B", 0), (7, "B", 1)],
         1: [(1, "F", 0), (3, "B", 0), (5, "F", 1), (7, "B", 1)]}   # starts (ms), kind, mb
    for r, acts in t.items():
        for ts, kind, mb in acts:
            ev.append(X(r, f"{kind} mb{mb} c0", kind, ts, 1 if kind == "F" else 2, step=0,
                        mb=mb, chunk=0))
    for k in range(2):
        ev.append(dict(X(0, "send", "comm", 1 + k, 0.1, op="send", group="pp", bytes=100_000,
                         peer=1, op_id=10 + k, tag=0), tid=2))
    return {"traceEvents": ev, "metadata": {
        "format": "partui-trace/1", "plan": asdict(Plan(**PLAN)),
        "model": asdict(ModelConfig(**MODEL))}}


def test_a_deeper_pipeline_with_more_microbatches_has_the_1f1b_makespan():
    table, step = repipe(pipeline_doc(), build_link("alpha_us=0,gbps=1e6"), pp=4, microbatches=4)
    # the model's F per microbatch: 1 ms x 2 stages; new chunk: / 4 stages x 2/4 tokens = 0.25 ms
    assert step["F_ms"] == pytest.approx(0.25)
    assert step["B_ms"] == pytest.approx(0.5)
    # 1F1B with uniform stages and free p2p: (M + P - 1)(F + B) = 7 x 0.75
    assert step["sim_pipe_ms"] == pytest.approx(7 * 0.75, rel=1e-6)
    assert step["rest_ms"] == pytest.approx(1.0)                 # 10 ms step - 9 ms window
    assert step["predicted_step_ms"] == pytest.approx(step["sim_pipe_ms"] + 1.0)
    assert list(table["stage"]) == [0, 1, 2, 3] and step["world"] == 4
    # stage k's own window (its first F to its last B) is (M + P - 1 - k)(F + B) long and holds
    # M (F + B) of work: bubble (P - 1 - k) / (M + P - 1 - k) = 3/7, 2/6, 1/5, 0
    assert table["sim_bubble_pct"].tolist() == pytest.approx(
        [100 * 3 / 7, 100 * 2 / 6, 100 / 5, 0], rel=1e-5, abs=1e-4)


def test_the_p2p_cost_is_the_links_send_of_the_scaled_activation():
    _t, step = repipe(pipeline_doc(), build_link("alpha_us=100,gbps=1"), pp=4, microbatches=4)
    # 100 us + 100 kB x 2/4 at 1 GB/s = 150 us; it lengthens the makespan past 5.25 ms
    assert step["p2p_ms"] == pytest.approx(0.15)
    assert step["sim_pipe_ms"] > 7 * 0.75 + 2 * 3 * 0.15


def test_the_recorded_plan_replays_its_own_costs():
    _t, step = repipe(pipeline_doc(), build_link("alpha_us=0,gbps=1000"))
    assert (step["pp"], step["microbatches"]) == (2, 2)
    assert step["F_ms"] == pytest.approx(1.0) and step["B_ms"] == pytest.approx(2.0)


@pytest.mark.parametrize("flags, says", [
    (["--pp", "3"], "4 layers are not divisible by 3 pipeline stages"),
    (["--pp", "4", "--microbatches", "2"], "1f1b needs microbatches >= pp = 4"),
    (["--microbatches", "3"], "is not divisible by 3 microbatches"),
    (["--pp", "0"], "--pp 0 must be >= 1"),
])
def test_impossible_changes_exit_2_with_the_fix(cli_here, tmp_path, flags, says):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(pipeline_doc()))
    p = cli_here("whatif", path, "--link", "alpha_us=0,gbps=1", *flags)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and says in p.stderr, p.stderr


def test_a_trace_without_a_pipeline_is_refused(cli_here, tmp_path):
    doc = pipeline_doc()
    doc["metadata"]["plan"]["pp"] = 1
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    p = cli_here("whatif", path, "--link", "alpha_us=0,gbps=1", "--pp", "2")
    assert p.returncode == 2 and "this trace ran pp 1: record one with --pp 2" in p.stderr
