"""A real `partui run --trace` (dp 2, ZeRO-2): loads in Perfetto, and the analysis reads it."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, run_here
from partui.analysis import load, overlap

CHECKER = os.path.join(ROOT, "..", "shared", "tools", "perfetto", "check.py")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def zero2_trace(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("z2") / "z2.json.gz")
    proc = run_here("run", "--dp", 2, "--zero", 2, "--steps", 4, "--trace", path,
                   "--trace-steps", "1:3", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.lines[-1]["summary"]["trace"] == path
    return path


def test_zero2_trace_has_steps_spans_and_reduce_scatter(zero2_trace):
    df = load(zero2_trace)
    assert set(df["rank"].dropna().astype(int)) == {0, 1}
    assert set(df.loc[df["cat"] == "step", "step"].dropna().astype(int)) == {1, 2}
    ops = set(df["op"].dropna())
    assert {"reduce_scatter", "all_gather"} <= ops
    by_step = overlap(df, "step")
    assert len(by_step) == 4  # 2 ranks x 2 traced steps
    assert (by_step["comm_ms"] > 0).all() and (by_step["compute_ms"] > 0).all()
    assert ((by_step["overlap_pct"] >= 0) & (by_step["overlap_pct"] <= 100)).all()


def test_zero2_trace_metadata_names_the_plan(zero2_trace):
    import gzip
    doc = json.load(gzip.open(zero2_trace))
    meta = doc["metadata"]
    assert meta["plan"]["zero"] == 2 and meta["steps"] == [1, 2]
    assert meta["torch"].startswith("2.") and meta["model"]["dim"] == 64


@pytest.mark.skipif(shutil.which("node") is None or not os.path.exists(CHECKER),
                    reason="the Perfetto checker needs node and ../shared/tools/perfetto")
def test_zero2_trace_loads_in_perfetto_with_zero_problems(zero2_trace):
    res = subprocess.run([sys.executable, CHECKER, zero2_trace], capture_output=True, text=True,
                         timeout=120)
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert res.returncode == 0 and report["problems"] == [], report
    assert "rank 1 · dp1" in report["processes"]


def test_report_cli_reads_the_real_trace(zero2_trace):
    proc = run_here("report", zero2_trace, "--by", "op", "--format", "json", check_rc=0)
    rows = json.loads(proc.stdout)["rows"]
    assert {r["op"] for r in rows} >= {"reduce_scatter", "all_gather"}


# ---------------------------------------------------------------- viztracer in both modes

LEARNER_CALLS = {"forward", "backward_input", "backward_weight", "optimizer_step", "update"}


def _traced(tmp_path_factory, name, *flags):
    path = str(tmp_path_factory.mktemp(name) / f"{name}.json")
    run_here("run", *flags, "--steps", 2, "--trace", path, check_rc=0)
    return path, json.load(open(path))


@pytest.fixture(scope="module")
def viz_traces(tmp_path_factory):
    """dp 2 sparse, dp 2 --trace-full and pp 2 1F1B sparse (schedule actions): (path, doc) each."""
    return {"sparse": _traced(tmp_path_factory, "sparse", "--dp", 2),
            "full": _traced(tmp_path_factory, "full", "--dp", 2, "--trace-full"),
            "pp": _traced(tmp_path_factory, "pp", "--pp", 2, "--microbatches", 2, "--schedule", "1f1b")}


def _calls(doc, rank):
    """viztracer's calls of one rank (cat FEE) and the rank's step spans."""
    evs = [e for e in doc["traceEvents"] if e.get("pid") == rank and e.get("ph") == "X"]
    return [e for e in evs if e.get("cat") == "FEE"], [e for e in evs if e.get("cat") == "step"]


def _depth(calls) -> int:
    """Deepest nesting of the calls on the compute track (tid 1)."""
    deepest, stack = 0, []
    for e in sorted((e for e in calls if e["tid"] == 1), key=lambda e: (e["ts"], -e["dur"])):
        while stack and stack[-1] <= e["ts"]:
            stack.pop()
        stack.append(e["ts"] + e["dur"])
        deepest = max(deepest, len(stack))
    return deepest


def _short(e) -> str:
    return e["name"].split(" (")[0].split(".")[-1]


def test_sparse_trace_logs_the_learners_functions_per_rank_inside_the_steps(viz_traces):
    for mode, expected in (("sparse", LEARNER_CALLS), ("pp", LEARNER_CALLS | {"do"})):
        doc = viz_traces[mode][1]
        for rank in (0, 1):
            calls, steps = _calls(doc, rank)
            assert len(steps) == 2 and expected <= {_short(e) for e in calls}, (mode, rank)
            assert {e["tid"] for e in calls} == {1}                      # the rank's compute track
            inside = [e for e in calls if any(s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"]
                                              for s in steps)]
            assert len(inside) == len(calls), (mode, rank)
            assert {_short(e) for e in calls} <= expected                # sparse: nothing else
            assert doc["metadata"]["plan"]["pp"] == (2 if mode == "pp" else 1)


def test_full_trace_holds_the_whole_call_tree_under_the_spans(viz_traces):
    sparse, full = viz_traces["sparse"][1], viz_traces["full"][1]
    for rank in (0, 1):
        calls, steps = _calls(full, rank)
        names = {_short(e) for e in calls}
        assert LEARNER_CALLS - {"update"} <= names and len(names) > 5 * len(LEARNER_CALLS)  # torch too
        on_track = [e for e in calls if e["tid"] == 1]
        assert len(on_track) > 0.9 * len(calls)             # nearly all nest under the recorder's spans
        assert _depth(calls) >= _depth(_calls(sparse, rank)[0]) + 3


def test_python_calls_change_no_overlap_or_bubble_figure_of_a_real_trace(viz_traces, tmp_path):
    for mode in ("full", "pp"):                    # pp: the pipeline's bubble columns too
        path, doc = viz_traces[mode]
        bare = dict(doc, traceEvents=[e for e in doc["traceEvents"] if e.get("cat") != "FEE"])
        bare_path = tmp_path / f"bare-{mode}.json"
        bare_path.write_text(json.dumps(bare))
        for by in ("rank", "step"):
            traced, plain = overlap(load(path), by), overlap(load(str(bare_path)), by)
            assert traced.equals(plain), (mode, by)
        assert mode == "full" or "pipe_bubble_pct" in traced.columns


@pytest.mark.skipif(shutil.which("node") is None or not os.path.exists(CHECKER),
                    reason="the Perfetto checker needs node and ../shared/tools/perfetto")
def test_sparse_and_full_traces_load_in_perfetto_with_zero_problems(viz_traces):
    paths = [viz_traces[m][0] for m in ("sparse", "full", "pp")]
    res = subprocess.run([sys.executable, CHECKER, *paths], capture_output=True, text=True, timeout=240)
    reports = [json.loads(ln) for ln in res.stdout.strip().splitlines()]
    assert res.returncode == 0 and [r["problems"] for r in reports] == [[], [], []], reports
    assert reports[1]["slices"] > 5 * reports[0]["slices"]
    assert reports[2]["flow_ends"] == {"send->recv": reports[2]["flows"]} and reports[2]["flows"] > 0
    assert reports[2]["flows_backward"] == 0
