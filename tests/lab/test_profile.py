"""`partui run --profile DIR`: one Kineto file per rank that partui, HTA and Perfetto read, and whose
EP all-to-all overlap agrees with the same run's partui trace."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, run_cli
from kernels.comm import events
from partui.analysis import load, overlap
from partui.analysis.reading.kineto import kineto_frame
from partui.recording.profile import OWN_TID, RankProfile, comm_op_ranges

CHECKER = os.path.join(ROOT, "..", "shared", "tools", "perfetto", "check.py")
pytestmark = pytest.mark.timeout(300)


def x(name, ts, dur, tid=7, **args):
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid, "ts": ts,
            "dur": dur, "args": args}


def test_marks_become_flight_and_post_ranges_at_partuis_own_times():
    # partui's clock (ns): issued at 1000, posted at 3000, done at 21000. Each mark's start on the
    # profiler's clock less when it was made: 5000 - 1200 = 3800, 7000 - 3100 = 3900, and a late
    # mark on another thread 30000 - 21500 = 8500: the offset is the smallest, 3800 ns.
    marks = [x("all_to_all ep", 5.0, 0.5, partui="issue", op_id=3, op="all_to_all", bytes=64,
               t_ns=1000, t_mark_ns=1200),
             x("posted all_to_all", 7.0, 0.25, partui="posted", op_id=3, t_ns=3000, t_mark_ns=3100),
             x("done all_to_all", 30.0, 0.5, tid=9, partui="done", op_id=3, t_ns=21000,
               t_mark_ns=21500),
             x("all_reduce dp", 40.0, 0.5, partui="issue", op_id=4, op="all_reduce", t_ns=36000,
               t_mark_ns=36100)]                 # never done, never posted: no range
    out = comm_op_ranges(marks)
    flights = [e for e in out if e["ph"] == "X" and e["args"]["partui"] == "comm"]
    posts = [e for e in out if e["ph"] == "X" and e["args"]["partui"] == "post"]
    assert [(e["name"], e["tid"], e["ts"], e["dur"], e["args"]["bytes"]) for e in flights] == \
        [("all_to_all ep", 2, 4.8, 20.0, 64)]   # (1000 + 3800) ns, 21000 - 1000 ns
    assert [(e["name"], e["tid"], e["ts"], e["dur"]) for e in posts] == \
        [("post all_to_all", 102, 4.8, 2.0)]
    assert {(e["tid"], e["args"]["name"]) for e in out if e["ph"] == "M"} == \
        {(2, "partui comm 1"), (102, "partui post 1")}


def test_cpu_path_takes_partui_ranges_as_its_own_trace_does():
    # compute [0, 100] with a wait [40, 60] inside; the op in flight [30, 80]; an aten op and gloo's
    # own range are only shown. Overlap by hand: compute less waits is [0, 40] + [60, 100], which
    # meets the flight for 10 + 20 = 30 of its 50 us: 60 %.
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": [
        x("ProfilerStep#1", 0.0, 100.0, tid=5),
        x("experts", 0.0, 100.0, partui="expert"),
        x("wait all_to_all", 40.0, 20.0, partui="wait"),
        x("all_to_all ep", 30.0, 50.0, tid=2, partui="comm", op="all_to_all", group="ep", bytes=64),
        {**x("aten::mm", 85.0, 10.0), "cat": "cpu_op"},
        x("gloo:all_to_all", 0.0, 100.0, tid=8)]}
    row = overlap(kineto_frame(doc), by="op").iloc[0]
    assert (row["op"], row["group"], row["bytes"]) == ("all_to_all", "ep", 64)
    assert row["comm_ms"] == pytest.approx(0.050)
    assert row["overlapped_ms"] == pytest.approx(0.030)
    assert row["overlap_pct"] == pytest.approx(60.0)


def test_one_process_profile_names_its_rank_and_keeps_span_args(tmp_path):
    prof = RankProfile(str(tmp_path), 3, 4).start()
    with events.span("step", "step", step=0), events.span("experts", "expert", layer=1):
        torch.ones(8).sum()
    path = prof.stop()
    assert os.listdir(tmp_path) == ["rank-3.json"]
    doc = json.load(open(path))
    assert (doc["distributedInfo"]["rank"], doc["distributedInfo"]["world_size"]) == (3, 4)
    raw, own = sorted((e for e in doc["traceEvents"] if e.get("name") == "experts"),
                      key=lambda e: e["tid"] == OWN_TID)
    assert raw["args"]["partui_range"] == "expert" and "partui" not in raw["args"]  # as recorded
    assert own["tid"] == OWN_TID and own["args"]["partui"] == "expert" and own["args"]["layer"] == 1
    assert own["dur"] == (own["args"]["t_end_ns"] - own["args"]["t_ns"]) / 1000   # its own time
    assert own["dur"] <= raw["dur"]              # the record_function range opens before, ends after
    assert [e["tid"] for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#0"] == [OWN_TID]
    with events.region("after", "stop") as after:
        pass
    assert "t_ns" not in after                   # the hook is gone with the profile


def test_a_failed_export_never_replaces_a_good_file(tmp_path, monkeypatch):
    good = tmp_path / "rank-0.json"
    good.write_text('{"good": 1}')
    prof = RankProfile(str(tmp_path), 0, 1).start()

    def broken(path):
        open(path, "w").write('{"half')
        raise OSError("disk full")
    monkeypatch.setattr(prof.profiler, "export_chrome_trace", broken)
    with pytest.raises(OSError):
        prof.stop()
    assert good.read_text() == '{"good": 1}'
    assert os.listdir(tmp_path) == ["rank-0.json"]   # the half-written temp file is gone


def test_profile_into_an_unwritable_folder_exits_2_before_launch(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    folder = str(blocker / "prof")
    proc = run_cli("run", "--dp", 2, "--steps", 1, "--profile", folder, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert folder in proc.stderr and "cannot be written" in proc.stderr


@pytest.fixture(scope="module")
def ep_run(tmp_path_factory):
    """One run, both recorders: torch.profiler over all 4 steps, partui's trace over steps 1 and 2."""
    d = tmp_path_factory.mktemp("prof")
    folder, trace = str(d / "prof"), str(d / "ep.json")
    proc = run_cli("run", "--ep", 2, "--experts", 4, "--overlap", "--microbatches", 2, "--steps", 4,
                   "--profile", folder, "--trace", trace, "--trace-steps", "1:3", "--json",
                   timeout=280)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return folder, trace


def test_one_file_per_rank_with_distributed_info(ep_run):
    folder, _ = ep_run
    assert sorted(os.listdir(folder)) == ["rank-0.json", "rank-1.json"]
    for r in (0, 1):
        doc = json.load(open(os.path.join(folder, f"rank-{r}.json")))
        info = doc["distributedInfo"]
        assert (info["rank"], info["world_size"]) == (r, 2)
        names = {e.get("name") for e in doc["traceEvents"]}
        assert {"experts", "all_to_all ep", "gloo:all_to_all", "ProfilerStep#3"} <= names


def test_report_agrees_with_the_trace_on_the_ep_all_to_all(ep_run):
    folder, trace = ep_run
    prof = load(folder)
    prof = prof[prof["step"].isin([1, 2]) | (prof["kind"] != "step")]  # the trace's steps
    mine = overlap(prof, by="op").set_index(["op", "group"]).loc[("all_to_all", "ep")]
    theirs = overlap(load(trace), by="op").set_index(["op", "group"]).loc[("all_to_all", "ep")]
    assert (mine["ops"], mine["bytes"]) == (theirs["ops"], theirs["bytes"])  # the same ops
    assert mine["overlap_pct"] > 20                                       # --overlap hides some
    assert abs(mine["overlap_pct"] - theirs["overlap_pct"]) <= 5, (mine, theirs)


def test_report_cli_reads_the_folder(ep_run):
    folder, _ = ep_run
    rows = json.loads(run_cli("report", folder, "--by", "op", "--format", "json",
                              check_rc=0).stdout)["rows"]
    assert any(r["op"] == "all_to_all" and r["group"] == "ep" and r["bytes"] > 0 for r in rows)


@pytest.mark.skipif(shutil.which("node") is None or not os.path.exists(CHECKER),
                    reason="the Perfetto checker needs node and ../shared/tools/perfetto")
def test_rank_file_loads_in_perfetto_with_zero_problems(ep_run):
    folder, _ = ep_run
    res = subprocess.run([sys.executable, CHECKER, os.path.join(folder, "rank-0.json")],
                         capture_output=True, text=True, timeout=240)
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert res.returncode == 0 and report["problems"] == [], report


def test_under_torchrun_each_rank_writes_its_file(tmp_path):
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun not installed")
    folder = str(tmp_path / "prof")
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "partui", "run",
                           "--ep", "2", "--experts", "4", "--steps", "2", "--profile", folder],
                          capture_output=True, text=True, timeout=280, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(folder)) == ["rank-0.json", "rank-1.json"]
    df = load(folder)
    assert set(df["rank"]) == {0, 1}
    row = overlap(df, by="op").set_index(["op", "group"]).loc[("all_to_all", "ep")]
    issued = [e for r in (0, 1) for e in json.load(open(os.path.join(folder, f"rank-{r}.json")))[
        "traceEvents"] if e.get("name") == "all_to_all ep" and e["args"].get("partui") == "issue"]
    assert row["ops"] == len(issued) > 0                   # every op issued is one flight read
    assert row["bytes"] == sum(e["args"]["bytes"] for e in issued)
