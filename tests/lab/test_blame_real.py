"""`partui blame` on the ByteDance straggler artifact's ST trace (8 ranks, dp 2 x pp 4, stage
imbalance), held to the paper's own what-if results shipped beside it (result-ST.json, ms-ST.json,
mw-ST.json): the straggler slowdown, its split by stage (stage 3 first) and by dp rank, M_S, M_W."""
import json
import os

import pytest

from partui.analysis.replay.blame import analyse
from partui.commands.blame import graphs_of, render_all

REAL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "real-traces",
                    "bytedance-straggler")
pytestmark = pytest.mark.skipif(not os.path.isdir(REAL), reason="../shared/real-traces is absent "
                                "(CI has it beside the checkout)")


def expected(name):
    with open(os.path.join(REAL, name)) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def st():
    """The json `partui blame --format json` prints, built in process."""
    doc = json.loads(render_all(analyse(graphs_of(os.path.join(REAL, "trace-ST.parquet"))), "json"))
    return doc


def test_slowdown_matches_the_paper(st):
    s = {r["figure"]: r["value"] for r in st["summary"]}
    ref = expected("result-ST.json")
    assert s["slowdown"] == pytest.approx(ref["blocking_slowdown"], rel=0.05)
    # the replay without launch gaps and the ideal one, step by step averaged
    steps = ref["step_t_nodelay"]
    assert s["replayed_s"] == pytest.approx(sum(steps.values()) / len(steps), rel=0.05)


def test_split_by_stage_puts_stage_3_first(st):
    ref = expected("result-ST.json")["blocking_decompose_by_stage"]
    got = {str(r["stage"]): r["slowdown"] for r in st["by stage"]}
    assert st["by stage"][0]["stage"] == 3
    assert got == pytest.approx(ref, rel=0.05)
    dp = {str(r["dp_rank"]): r["slowdown"] for r in st["by dp rank"]}
    assert dp == pytest.approx(expected("result-ST.json")["blocking_decompose_by_dp_rank"], rel=0.05)


def test_m_s_and_m_w_match_the_paper(st):
    s = {r["figure"]: r["value"] for r in st["summary"]}
    assert s["M_S"] == pytest.approx(expected("ms-ST.json")["Ms"], rel=0.05)
    assert s["M_W"] == pytest.approx(expected("mw-ST.json")["Mw"], rel=0.05)
