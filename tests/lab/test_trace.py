"""RankTracer (partui.recording.trace) and stitch / merge (partui.recording.tracefile): synthetic recorder
calls, a real 2-rank gloo run, Perfetto, atomic write."""
import gzip
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT
from worlds import run_world

from kernels.comm import events
from partui.recording import tracefile
from partui.recording import sparse_log
from partui.recording.trace import RankTracer, nest_python
from partui.recording.tracefile import (COMM_TID, COMPUTE_OVERFLOW_TID, COMPUTE_TID, PY_TID, merge,
                                        remove_stale_partials, stitch, write_atomic)

# shared/ sits beside the checkout (here and in CI)
CHECKER = os.path.join(ROOT, "..", "shared",
                       "tools", "perfetto", "check.py")

def _open(path):
    return gzip.open(path) if path.endswith(".gz") else open(path)


def _spans(doc, **match):
    return [e for e in doc["traceEvents"] if all(e.get(k) == v for k, v in match.items())]


def test_recorder_builds_compute_comm_and_wait_spans():
    t = RankTracer(0, "dp0").start()
    assert events.recorder() is t
    t.compute("F", "F", 1_000, 5_000, {"step": 0, "mb": 1})
    t.comm_issue(7, "all_reduce", "dp", 64, None, 2_000, {})
    t.comm_issue(8, "all_gather", "dp", 32, None, 2_500, {})  # overlaps op 7: a second lane
    threading.Thread(target=t.comm_complete, args=(7, 4_000)).start()  # gloo's thread
    t.comm_complete(8, 3_000)
    t.comm_wait(7, 4_500, 4_800)  # completion came first: in flight ends at 4_000
    t.counter("mem", 3_000, {"bytes": 5})
    time.sleep(0.01)
    ev = t.stop()
    assert events.recorder() is None
    json.dumps(ev)  # plain JSON-able
    by_name = {e["name"]: e for e in ev["events"] if e["ph"] in ("X", "C") and e["pid"] == 0
               and e.get("cat") != "FEE"}
    f, ar, ag = by_name["F"], by_name["all_reduce"], by_name["all_gather"]
    assert (f["ts"], f["dur"], f["tid"], f["cat"], f["args"]) == (1.0, 4.0, COMPUTE_TID, "F",
                                                                  {"step": 0, "mb": 1})
    assert (ar["ts"], ar["dur"], ar["tid"]) == (2.0, 2.0, COMM_TID)
    assert (ag["ts"], ag["dur"], ag["tid"]) == (2.5, 0.5, COMM_TID + 1)
    assert ar["args"]["group"] == "dp" and ar["args"]["bytes"] == 64
    w = by_name["wait all_reduce"]
    assert (w["ts"], w["dur"], w["tid"], w["cat"]) == (4.5, 0.3, COMPUTE_TID, "wait")
    assert by_name["mem"]["args"] == {"bytes": 5}


def test_wait_before_callback_ends_flight_and_unfinished_op_runs_to_stop():
    t = RankTracer(1, "").start()
    t.comm_issue(1, "recv", "pp", 16, 0, 1_000, {"tag": 0})
    t.comm_wait(1, 1_200, 1_500)
    t.comm_complete(1, 9_000)  # the callback ran late: the wait's return already proved it done
    t.comm_issue(2, "send", "pp", 16, 0, 2_000, {"tag": 0})  # never completes
    t.comm_issue(3, "all_reduce", "tp", 0, None, 2_100, {})  # a group of one
    ev = t.stop()
    ops = {e["args"]["op_id"]: e for e in ev["events"] if e.get("cat") == "comm"}
    assert ops[1]["dur"] == 0.5
    assert ops[2]["args"]["unfinished"] and ops[2]["ts"] + ops[2]["dur"] == ev["t1_us"]
    assert ops[3]["dur"] == 0.0


def test_wait_crossing_a_span_moves_off_the_compute_track():
    t = RankTracer(0).start()
    t.compute("F", "F", 1_000, 3_000, {})
    t.comm_issue(1, "all_reduce", "dp", 8, None, 500, {})
    t.comm_wait(1, 2_000, 4_000)  # from another thread: crosses F's end
    ev = t.stop()
    w = [e for e in ev["events"] if e["name"] == "wait all_reduce"][0]
    assert w["tid"] == COMPUTE_OVERFLOW_TID


def test_sparse_tracer_removes_its_profile_hook():
    t = RankTracer(0, sparse=True).start()
    try:
        assert sys.getprofile() is None
    finally:
        t.stop()



def test_sparse_tracer_logs_a_layer_call_on_the_compute_track_and_unwraps_after():
    import torch
    from kernels.layers.base import Param
    from kernels.layers.linear import Linear
    from kernels.optim import Optimizer
    plain = vars(Linear)["forward"], vars(Optimizer)["step"]
    assert (Linear, "backward_weight") in sparse_log.targets()
    lin = Linear(Param("w", torch.ones(3, 2)))
    t = RankTracer(0, sparse=True).start()
    try:
        assert vars(Linear)["forward"] is not plain[0]      # wrapped while tracing
        with events.span("F", "F"):
            lin.forward(torch.ones(1, 2))
    finally:
        ev = t.stop()
    assert (vars(Linear)["forward"], vars(Optimizer)["step"]) == plain   # and put back
    f = [e for e in ev["events"] if e["name"] == "F"][0]
    calls = [e for e in ev["events"] if e.get("cat") == "FEE"]
    assert [c["name"].split(" (")[0] for c in calls] == ["forward"] and "linear.py" in calls[0]["name"]
    c = calls[0]
    assert c["pid"] == 0 and c["tid"] == COMPUTE_TID == f["tid"]
    assert f["ts"] <= c["ts"] and c["ts"] + c["dur"] <= f["ts"] + f["dur"]   # under its span


def _call(ts, dur):
    return {"ph": "X", "name": f"call {ts}", "cat": "FEE", "pid": 0, "tid": PY_TID, "ts": ts, "dur": dur}


def test_python_calls_join_the_compute_track_only_where_they_nest():
    track = [{"ph": "X", "name": "F", "cat": "F", "pid": 0, "tid": COMPUTE_TID, "ts": 10.0, "dur": 10.0}]
    around, inside, crosses_end, crosses_start = _call(5, 20), _call(12, 6), _call(15, 15), _call(8, 7)
    inner = _call(13, 1)                                       # inside `inside`
    nest_python(track, [around, inside, crosses_end, crosses_start, inner])
    assert [c["tid"] for c in (around, inside, inner)] == [COMPUTE_TID] * 3
    assert crosses_end["tid"] == PY_TID and crosses_start["tid"] == PY_TID
    assert track[0]["tid"] == COMPUTE_TID and track[0]["ts"] == 10.0   # the recorder's span stays


def test_viztracerclock_maps_onto_ours_through_two_readings():
    from partui.recording.trace import clock_map
    to_ours = clock_map((1000.0, 50.0), (3000.0, 2050.2))    # viztracer ran 0.01% fast
    assert to_ours(50.0) == 1000.0 and to_ours(2050.2) == pytest.approx(3000.0)
    assert to_ours(1050.1) == pytest.approx(2000.0) and to_ours.rate == pytest.approx(2000 / 2000.2)


def test_clock_pair_keeps_the_narrowest_of_its_brackets():
    """A busy machine preempts a rank between its two clocks' reads; the pair must not take the
    stall as offset (CI saw learner calls 16 us early, crossing the spans they ran under)."""
    from partui.recording.trace import clock_pair

    class StalledViz:                                  # viztracer's clock = ours + 5,000 us
        reads = 0

        def getts(self):
            self.reads += 1
            if self.reads != 20:                       # every read but one stalls 2 ms first
                time.sleep(0.002)
            return time.perf_counter_ns() / 1000 + 5000.0

    ours, viz = clock_pair(StalledViz())
    assert abs(viz - ours - 5000.0) < 500.0            # a stalled bracket is ~1,000 us off


def _fake_rank(rank, sends=(), recvs=()):
    evs = [{"ph": "X", "name": "F", "cat": "F", "pid": rank, "tid": 1, "ts": 0.0, "dur": 10.0,
            "args": {}}]
    for ts, peer in sends:
        evs.append({"ph": "X", "name": "send", "cat": "comm", "pid": rank, "tid": 2, "ts": ts,
                    "dur": 2.0, "args": {"op": "send", "peer": peer, "tag": 0}})
    for ts, peer in recvs:
        evs.append({"ph": "X", "name": "recv", "cat": "comm", "pid": rank, "tid": 2, "ts": ts,
                    "dur": 2.0, "args": {"op": "recv", "peer": peer, "tag": 0}})
    return {"rank": rank, "coords": f"pp{rank}", "events": evs, "t0_us": 0.0, "t1_us": 20.0}


def test_merge_names_processes_pairs_kth_send_with_kth_recv(tmp_path):
    r0 = _fake_rank(0, sends=[(1.0, 1), (5.0, 1)])
    r1 = _fake_rank(1, recvs=[(6.0, 0), (2.0, 0)])  # out of order in the list: matched by time
    path = merge([r1, r0], str(tmp_path / "t.json.gz"), {"plan": {"pp": 2}})
    doc = json.load(gzip.open(path))
    assert doc["metadata"]["plan"] == {"pp": 2} and doc["displayTimeUnit"] == "ms"
    names = {e["pid"]: e["args"]["name"] for e in _spans(doc, name="process_name")}
    assert names == {0: "rank 0 · pp0", 1: "rank 1 · pp1"}
    outs = sorted(_spans(doc, flow_out=True), key=lambda e: e["ts"])
    ins = sorted(_spans(doc, flow_in=True), key=lambda e: e["ts"])
    assert [(o["name"], o["ts"], i["name"], i["ts"]) for o, i in zip(outs, ins)] == [
        ("send", 1.0, "recv", 2.0), ("send", 5.0, "recv", 6.0)]
    assert [o["bind_id"] for o in outs] == [i["bind_id"] for i in ins] and len(set(
        o["bind_id"] for o in outs)) == 2
    assert not _spans(doc, ph="s") and not _spans(doc, ph="f")


def test_send_ends_at_its_recv_completion_and_arrow_binds_recv_posted_first(tmp_path):
    # the recv (rank 1) is posted at 1, before the send at 3; the send is seen done only at 50
    r0 = _fake_rank(0, sends=[(3.0, 1)])
    r1 = _fake_rank(1, recvs=[(1.0, 0)])
    r0["events"][-1]["dur"] = 47.0
    r1["events"][-1]["dur"] = 4.0                      # the bytes arrived at 5
    doc = tracefile.build_doc([r0, r1])
    send = _spans(doc, name="send")[0]
    recv = _spans(doc, name="recv")[0]
    assert (send["ts"], send["dur"], send["args"]["end"]) == (3.0, 2.0, "recv")
    # the recv moved nothing before the send was posted: in flight from just after 3 to 5, so
    # it begins after the send, as Perfetto needs to draw the arrow send -> recv
    assert recv["ts"] == pytest.approx(3.001) and recv["ts"] + recv["dur"] == pytest.approx(5.0)
    assert recv["args"]["posted_early_us"] == pytest.approx(2.001)
    assert send["flow_out"] and recv["flow_in"] and send["bind_id"] == recv["bind_id"]
    assert r0["events"][-1]["dur"] == 47.0             # the caller's events are left as they were


def test_comm_lanes_never_overlap_and_are_reassigned_after_trimming():
    ops = [{"ts": t0, "dur": d, "tid": None} for t0, d in [(0, 10), (1, 2), (2, 1), (4, 1), (11, 1)]]
    assert tracefile.assign_comm_lanes(ops) == 3
    assert [e["tid"] - COMM_TID for e in ops] == [0, 1, 2, 1, 0]


def test_failed_merge_leaves_old_file_untouched(tmp_path, monkeypatch):
    path = tmp_path / "run.json"
    merge([_fake_rank(0)], str(path), {"run": "old"})
    before = path.read_bytes()

    def dies(doc, f):
        f.write(b'{"traceEvents": [')  # half a file, then the process is interrupted
        raise KeyboardInterrupt

    monkeypatch.setattr(tracefile, "dump", dies)
    with pytest.raises(KeyboardInterrupt):
        merge([_fake_rank(0)], str(path), {"run": "new"})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["run.json"]  # no temp file left behind


def test_stitch_joins_windows_per_rank_and_ends_at_the_last():
    a = [_fake_rank(0), _fake_rank(1)]
    b = [dict(_fake_rank(0), t0_us=100.0, t1_us=150.0), dict(_fake_rank(1), t0_us=100.0, t1_us=160.0)]
    per_rank = stitch([a, b])
    assert [len(r["events"]) for r in per_rank] == [2, 2]
    assert [(r["t0_us"], r["t1_us"]) for r in per_rank] == [(0.0, 150.0), (0.0, 160.0)]
    assert len(a[0]["events"]) == 1  # the windows themselves are left as they were
    with pytest.raises(ValueError, match="no windows"):
        stitch([])


def test_merge_of_nothing_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no ranks"):
        merge([], str(tmp_path / "x.json"), {})


# ---------------------------------------------------------------- a real 2-rank gloo run

def _rank_main(rank, size):
    import torch
    from kernels import comm
    from kernels.comm.events import counter, span
    world = comm.world_group()
    t = RankTracer(rank, f"dp{rank} pp{rank}").start()
    x = torch.ones(1 << 14)
    for step in range(2):
        with span("step", "step", step=step):
            with span("F", "F", step=step, mb=0, layer=0):
                x = x * 1.0001
            h = comm.all_reduce(x, world, async_op=True)
            with span("B", "B", step=step, mb=0):
                y = (x @ x).item()
            h.wait()
            buf = torch.zeros(256)
            if rank == 0:
                comm.send(torch.full((256,), float(y)), 1, world, tag=step)
            else:
                comm.recv(buf, 0, world, tag=step)
            counter("memory", bytes=int(x.numel() * 4))
            with span("optimizer", "optimizer", step=step):
                x.mul_(0.5)
    return t.stop()


@pytest.fixture(scope="module")
def gloo_trace(tmp_path_factory):
    d = tmp_path_factory.mktemp("gloo")
    per_rank = run_world(2, _rank_main, timeout_s=120)
    return merge(per_rank, str(d / "run.json"), {"plan": {"dp": 2}, "steps": [0, 1]})


@pytest.mark.timeout(180)
def test_real_gloo_trace_has_both_ranks_flows_and_metadata(gloo_trace):
    doc = json.load(open(gloo_trace))
    assert {e["pid"] for e in doc["traceEvents"]} == {0, 1}
    ops = {e["args"]["op"] for e in _spans(doc, cat="comm")}
    assert ops == {"all_reduce", "send", "recv"}
    assert len(_spans(doc, flow_out=True)) == 2 == len(_spans(doc, flow_in=True))
    assert len(_spans(doc, cat="step")) == 4
    assert any(e["name"] == "wait all_reduce" for e in doc["traceEvents"])


@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("node") is None or not os.path.exists(CHECKER),
                    reason="the Perfetto checker needs node and ../shared/tools/perfetto")
def test_real_gloo_trace_loads_in_perfetto_with_zero_problems(gloo_trace):
    for path in (gloo_trace, _gz_copy(gloo_trace)):
        res = subprocess.run([sys.executable, CHECKER, path], capture_output=True, text=True,
                             timeout=120)
        report = json.loads(res.stdout.strip().splitlines()[-1])
        assert res.returncode == 0, report
        assert report["problems"] == [] and report["counters"] == 4
        assert report["flows"] == 2 and report["flows_backward"] == 0
        assert report["flow_ends"] == {"send->recv": 2} and report["sends_ending_after_recv"] == 0
        assert "rank 0 · dp0 pp0" in report["processes"] and "comm" in report["threads"]


def _gz_copy(path):
    gz = path + ".gz"
    with open(path, "rb") as src, gzip.open(gz, "wb") as dst:
        dst.write(src.read())
    return gz


def test_stale_partial_files_of_a_killed_writer_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()   # a pid that has exited
    stale = tmp_path / f".partial-{dead}-abc123.tmp"
    old = tmp_path / ".partial-xyz789.tmp"                 # the old unnamed form, two hours old
    live = tmp_path / f".partial-{os.getpid()}-live00.tmp"   # a writer still running: kept
    other = tmp_path / "keep.tmp"
    for f in (stale, old, live, other):
        f.write_text("x")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    write_atomic(str(tmp_path / "t.json"), {"traceEvents": []})
    assert not stale.exists() and not old.exists() and live.exists() and other.exists()
    assert (tmp_path / "t.json").exists()
    assert remove_stale_partials(str(tmp_path)) == []


def test_bench_trace_quotes_each_modes_overhead_per_round_and_flags_noise():
    from partui.bench.trace import overhead_rows, verdict
    # round medians (ms): off 10, 20, 10; sparse +2%, +1%, +4%; full 2x, 2x, 3x
    rows = {r["mode"]: r for r in overhead_rows({"off": [10.0, 20.0, 10.0], "sparse": [10.2, 20.2, 10.4],
                                                 "full": [20.0, 40.0, 30.0]})}
    assert rows["off"]["overhead_pct"] == 0 and verdict(rows["off"]) == "baseline"
    assert rows["sparse"]["overhead_pct"] == pytest.approx(2.0) and rows["sparse"]["step_ms"] == 10.4
    assert (rows["sparse"]["min_pct"], rows["sparse"]["max_pct"]) == pytest.approx((1.0, 4.0))
    assert rows["full"]["overhead_pct"] == pytest.approx(100.0) and rows["full"]["max_pct"] == pytest.approx(200)
    assert verdict(rows["sparse"]) == "rounds +1.0% .. +4.0%"
    noisy = overhead_rows({"off": [10.0, 10.0, 10.0], "sparse": [9.8, 9.9, 10.3]})[1]
    assert noisy["overhead_pct"] == pytest.approx(-1.0)
    assert verdict(noisy).startswith("below the noise") and "-2.0% .. +3.0%" in verdict(noisy)
    mixed = overhead_rows({"off": [10.0, 10.0, 10.0], "sparse": [9.9, 10.1, 10.2]})[1]
    assert verdict(mixed) == "within the noise (rounds -1.0% .. +2.0%)"


def test_bench_trace_reports_the_worst_traced_step_beside_the_median():
    from partui.bench.trace import overhead_rows
    # a stall in one traced step of round 2 (60 ms against that round's off median of 20)
    rows = {r["mode"]: r for r in overhead_rows(
        {"off": [10.0, 20.0, 10.0], "sparse": [10.2, 20.2, 10.4]},
        {"off": [11.0, 22.0, 10.5], "sparse": [10.5, 60.0, 10.6]})}
    assert rows["sparse"]["overhead_pct"] == pytest.approx(2.0)      # the median hides it
    assert rows["sparse"]["worst_ms"] == 60.0 and rows["sparse"]["worst_pct"] == pytest.approx(200.0)
    assert rows["off"]["worst_ms"] == 22.0 and rows["off"]["worst_pct"] == pytest.approx(10.0)
