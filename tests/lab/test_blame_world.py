"""A straggler made on purpose (`partui run --slow-rank R=F`) and found again by `partui blame`:
on dp 2 and on pp 2 x dp 2 the slowed rank (or its stage) comes first (factor 2: this machine is
shared, and a 1.5 signal drowns in its noise within a few steps), and its extra time is in
the trace as compute spans of that rank only. Plan flags: a bad --slow-rank / --slow-stage exits 2."""
import gzip
import json

import pytest


def traced(cli, tmp_path, *plan):
    path = tmp_path / "t.json.gz"
    cli("run", *plan, "--model", "tiny", "--steps", 6, "--trace", path, timeout=400, check_rc=0)
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    p = cli("blame", path, "--format", "json", timeout=200, check_rc=0)
    out = json.loads(p.stdout)
    return doc, {r["figure"]: r["value"] for r in out["summary"]}, out


def straggle_ranks(doc):
    return {e["pid"] for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name") == "straggle"}


def test_dp2_blame_names_the_slowed_rank(cli, tmp_path):
    doc, s, out = traced(cli, tmp_path, "--dp", 2, "--slow-rank", "1=2")
    assert straggle_ranks(doc) == {1}
    assert s["worst worker"] == 1 and s["top dp rank"] == 1
    assert s["slowdown"] > 1.0
    assert "slowdown" in out["definitions"]


def test_pp2_dp2_blame_names_the_slowed_rank_or_its_stage(cli, tmp_path):
    # rank 1 = dp 1, pp 0 (coordinates: dp inner, pp outer)
    doc, s, _ = traced(cli, tmp_path, "--pp", 2, "--dp", 2, "--microbatches", 2, "--slow-rank", "1=2")
    assert straggle_ranks(doc) == {1}
    assert s["worst worker"] == 1 or s["top stage"] == 0


@pytest.mark.parametrize("flag,value,needle", [("--slow-rank", "7=1.5", "rank 7"),
                                               ("--slow-rank", "1:2", "WHO=FACTOR"),
                                               ("--slow-rank", "1=0.5", "factor >= 1"),
                                               ("--slow-stage", "3=2", "stage 3")])
def test_a_bad_slow_flag_exits_2(cli, flag, value, needle):
    p = cli("plan", "--dp", 2, flag, value, timeout=120)
    assert p.returncode == 2 and needle in p.stderr + p.stdout and "Traceback" not in p.stderr
