"""The memory account where a user sees it: the run summary's peak per rank by kind, the trace's
counter tracks (Perfetto loads them), and `partui report TRACE --memory` (the peak, the action at
it, each kind then; `--plot`), held to the trace's own counters read here."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, run_here
from partui.analysis.figures.memory import MIB, memory_samples, memory_table
from planning.config import ModelConfig
from planning.memory_kinds import KINDS
from kernels.recompute import forward_share

CHECKER = os.path.join(ROOT, "..", "shared", "tools", "perfetto", "check.py")


def test_the_report_reads_every_kind_of_a_counter():
    # one counter sample with kind i holding i + 1 bytes: each kind's column, and their total
    doc = {"traceEvents": [{"ph": "C", "name": "memory", "pid": 0, "ts": 5.0,
                            "args": {k: i + 1 for i, k in enumerate(KINDS)}}]}
    row = memory_samples(doc).iloc[0]
    assert [row[k] for k in KINDS] == [1, 2, 3, 4, 5, 6, 7] and row["total"] == 28


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mem") / "pp2.json")
    proc = run_here("run", "--pp", 2, "--microbatches", 4, "--steps", 2, "--trace", path,
                   "--json", check_rc=0)
    return path, proc.lines[-1]["summary"]


def _counter_peaks(path) -> dict:
    """Per rank, the largest sum of a memory counter's args, read straight from the JSON."""
    doc = json.load(open(path))
    peaks = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "C" and e.get("name") == "memory":
            peaks[e["pid"]] = max(peaks.get(e["pid"], 0), sum(e["args"].values()))
    return peaks


@pytest.mark.timeout(400)
def test_summary_trace_and_report_agree_on_each_ranks_peak(traced):
    path, summary = traced
    peaks = _counter_peaks(path)
    assert sorted(peaks) == [0, 1]
    # the summary's peak per rank (over both steps, all traced) is the counters' largest total
    assert [m["peak"] for m in summary["memory_peak"]] == [peaks[0], peaks[1]]
    for m in summary["memory_peak"]:
        assert sum(m["peak_kinds"].values()) == m["peak"] and set(m["peak_kinds"]) == set(KINDS)
        assert m["peak_kinds"]["activations"] > 0 and m["peak_kinds"]["params"] > 0
    proc = run_here("report", path, "--memory", "--format", "json", check_rc=0)
    doc = json.loads(proc.stdout)
    rows = {r["rank"]: r for r in doc["rows"]}
    for rank, peak in peaks.items():
        row = rows[rank]
        assert abs(row["peak_mib"] - peak / MIB) < 1e-3
        assert abs(sum(row[f"{k}_mib"] for k in KINDS) - row["peak_mib"]) < 1e-2
        assert row["peak_at"].split()[0] in ("F", "B", "BW", "W", "FB", "after")
    assert "peak_mib" in doc["definitions"] and "activations_mib" in doc["definitions"]
    table = run_here("report", path, "--memory", check_rc=0).stdout
    assert "peak_at" in table and "activations_mib: --memory:" in table     # with its legend


@pytest.mark.timeout(200)
@pytest.mark.skipif(shutil.which("node") is None or not os.path.exists(CHECKER),
                    reason="the Perfetto checker needs node and ../shared/tools/perfetto")
def test_counter_tracks_load_in_perfetto(traced):
    res = subprocess.run([sys.executable, CHECKER, traced[0]], capture_output=True, text=True,
                         timeout=150)
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert res.returncode == 0 and report["problems"] == [], report
    n = sum(1 for e in json.load(open(traced[0]))["traceEvents"] if e.get("ph") == "C")
    assert report["counters"] == n * len(KINDS)     # one track per kind, on each rank


def _write(tmp_path, events):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return str(path)


def _mem(rank, ts, **kinds):
    return {"ph": "C", "name": "memory", "pid": rank, "tid": 1, "ts": ts,
            "args": {k: kinds.get(k, 0) for k in KINDS}}


def test_peak_and_the_action_at_it_on_a_hand_built_trace(tmp_path):
    span = lambda rank, name, cat, ts, dur: {"ph": "X", "name": name, "cat": cat, "pid": rank,
                                             "tid": 1, "ts": ts, "dur": dur}
    path = _write(tmp_path, [
        span(0, "step", "step", 0, 100), span(0, "F mb0 c0", "F", 10, 20),
        span(0, "F block 0", "layer", 12, 5),
        _mem(0, 5, params=MIB), _mem(0, 15, params=MIB, activations=3 * MIB),
        _mem(0, 40, params=MIB, activations=MIB),
        span(1, "step", "step", 0, 100), span(1, "F mb0 c0", "F", 10, 20),
        _mem(1, 20, params=MIB, activations=MIB), _mem(1, 35, params=MIB, activations=MIB,
                                                        comm=MIB),     # a recv posted after F
    ])
    table, samples = memory_table(path)
    assert len(samples) == 5
    r0, r1 = table.to_dict("records")
    assert (r0["peak_mib"], r0["peak_at"], r0["activations_mib"]) == (4.0, "F mb0 c0", 3.0)
    assert (r1["peak_mib"], r1["peak_at"], r1["comm_mib"]) == (3.0, "after F mb0 c0", 1.0)


def test_a_trace_without_counters_exits_2_naming_the_fix(tmp_path):
    path = _write(tmp_path, [{"ph": "X", "name": "F", "cat": "F", "pid": 0, "tid": 1, "ts": 0,
                              "dur": 1}])
    proc = run_here("report", path, "--memory", check_rc=2)
    assert "no memory counters" in proc.stderr and "--trace" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                    reason="--plot needs the optional matplotlib")
def test_plot_writes_a_png(tmp_path):
    path = _write(tmp_path, [_mem(0, 0, params=MIB), _mem(0, 10, params=MIB, activations=MIB)])
    png = tmp_path / "m.png"
    run_here("report", path, "--memory", "--plot", png, check_rc=0)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(200)
def test_plan_prints_predicted_beside_measured(traced):
    path, summary = traced
    proc = run_here("plan", "--pp", 2, "--microbatches", 4, "--trace", path, "--json", check_rc=0)
    doc = json.loads(proc.stdout)
    for rank, measured in zip(doc["ranks"], doc["measured"]):
        pred = rank["predicted"]
        # 1F1B keeps whole forwards in flight: the formula is the measure, to the byte
        assert pred["activations"] == summary["memory_peak"][rank["rank"]]["kind_peaks"]["activations"]
        assert abs(pred["activations"] / MIB - measured["activations_mib"]) < 1e-3
        assert pred["activation_microbatches"] == 2 - rank["rank"]       # min(P - r, M)
    text = run_here("plan", "--pp", 2, "--microbatches", 4, "--trace", path, check_rc=0).stdout
    assert "memory predicted per rank" in text and "measured peak MiB" in text
    bad = run_here("plan", "--pp", 4, "--microbatches", 4, "--trace", path, check_rc=2)
    assert "has 2 ranks, the plan 4" in bad.stderr


@pytest.mark.timeout(300)
def test_full_recompute_checks_and_shows_its_extra_compute(tmp_path, traced):
    path = str(tmp_path / "rc.json")
    runs = {}
    for mode in ("none", "full"):
        proc = run_here("run", "--pp", 2, "--microbatches", 4, "--steps", 1, "--recompute", mode,
                       "--check", "--json", *(["--trace", path] if mode == "full" else []), check_rc=0)
        runs[mode] = proc.lines[-1]["summary"]
        assert runs[mode]["check"] == "passed"
    for before, after in zip(runs["none"]["memory_peak"], runs["full"]["memory_peak"]):
        assert after["kind_peaks"]["activations"] < before["kind_peaks"]["activations"]
    doc = json.load(open(path))
    redo = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("R block")]
    # each of the 4 blocks (2 a stage) runs its forward again before each microbatch's backward
    assert len(redo) == 4 * 4 and all(e["cat"] == "layer" and e["dur"] > 0 for e in redo)
    # whatif on the trace recorded without recompute predicts the recompute run's activations
    proc = run_here("whatif", traced[0], "--recompute", "full", "--format", "json", check_rc=0)
    rows = json.loads(proc.stdout)["rows"]
    forwards = recorded_forwards_ms(json.load(open(traced[0])))
    for row, after in zip(rows, runs["full"]["memory_peak"]):
        assert_predicts_activations(row, after)
        assert abs(row["extra_compute_ms"] - forwards[row["rank"]]) < 1e-2


def recorded_forwards_ms(doc) -> dict:
    """Per rank, its "F block" spans' ms per recorded step, read straight from the JSON."""
    events = doc["traceEvents"]
    steps = len({e["args"]["step"] for e in events if e.get("cat") == "step"})
    out = {}
    for e in events:
        if e.get("ph") == "X" and e["name"].startswith("F block "):
            out[e["pid"]] = out.get(e["pid"], 0.0) + e["dur"] / 1e3 / steps
    return out


def assert_predicts_activations(row, after):
    """whatif's row holds the recompute run's measured activation peak, and saved adds up."""
    assert abs(row["recompute_activations_mib"] - after["kind_peaks"]["activations"] / MIB) < 1e-3
    assert abs(row["peak_activations_mib"] - row["recompute_activations_mib"] - row["saved_mib"]) < 2e-3


@pytest.mark.timeout(300)
def test_selective_recompute_checks_shows_its_spans_and_whatif_predicts_it(tmp_path, traced):
    path = str(tmp_path / "sel.json")
    proc = run_here("run", "--pp", 2, "--microbatches", 4, "--steps", 1, "--recompute", "selective",
                   "--check", "--json", "--trace", path, check_rc=0)
    summary = proc.lines[-1]["summary"]
    assert summary["check"] == "passed"
    full = json.loads(run_here("whatif", traced[0], "--recompute", "full", "--format", "json",
                              check_rc=0).stdout)["rows"]     # = a full run's, pinned above
    for before, after, lowest in zip(traced[1]["memory_peak"], summary["memory_peak"], full):
        kept, none = after["kind_peaks"]["activations"], before["kind_peaks"]["activations"]
        assert lowest["recompute_activations_mib"] * MIB < kept < none
    doc = json.load(open(path))
    redo = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("R block")]
    # each of the 4 blocks rebuilds its norms, softmax and activation before each microbatch's B
    assert len(redo) == 4 * 4 and all(e["args"].get("recompute") == "selective" and e["dur"] > 0
                                      for e in redo)
    proc = run_here("whatif", traced[0], "--recompute", "selective", "--format", "json", check_rc=0)
    rows = json.loads(proc.stdout)["rows"]
    plain = json.load(open(traced[0]))
    cfg = ModelConfig(**plain["metadata"]["model"])
    share = forward_share("selective", cfg, cfg.seq)        # pinned in tests/kernels/test_recompute
    forwards = recorded_forwards_ms(plain)
    for row, after in zip(rows, summary["memory_peak"]):
        assert_predicts_activations(row, after)
        # the recomputed part of each recorded block forward, well under full's whole forward
        assert abs(row["extra_compute_ms"] - share * forwards[row["rank"]]) < 1e-2
        assert 0 < row["extra_compute_ms"] < 0.5 * forwards[row["rank"]]
