"""A real `partui run --trace` (dp 2, ZeRO-2): loads in Perfetto, and the analysis reads it."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from partui.analysis import load, overlap

CHECKER = os.path.join(ROOT, "..", "shared", "tools", "perfetto", "check.py")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def zero2_trace(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("z2") / "z2.json.gz")
    proc = run_cli("run", "--dp", 2, "--zero", 2, "--steps", 4, "--trace", path,
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
    proc = run_cli("report", zero2_trace, "--by", "op", "--format", "json", check_rc=0)
    rows = json.loads(proc.stdout)["rows"]
    assert {r["op"] for r in rows} >= {"reduce_scatter", "all_gather"}
