"""`partui blame`: hand-built step graphs whose critical path and what-if figures are worked by
hand (a chain, a collective one late member delays, a pipeline bubble), the replay core's batched
columns against one replay per column, bad input (exit 2, the column or rank named), and a
hand-built partui trace: its late rank blamed and its critical path marked for Perfetto."""
import json
import sys

import numpy as np
import pandas as pd
import pytest

from partui.analysis.replay.blame import analyse, blame_line, blame_text, critical_path, typical_durations
from partui.analysis.table.events import TraceError
from partui.analysis.reading.op_table import read_op_table
from partui.analysis.replay.opgraph import Node, StepGraph, step_time
from partui.analysis.replay.partui_graph import partui_graphs


def node(name, rank, dur, optype="compute", after=(), group=None, stage=0, dp=None, lane="c"):
    return Node((name, rank), (rank, lane), dur, optype, rank, rank if dp is None else dp, stage,
                tuple(after), group, kind=optype)


def collective(name, rank, transfer, after=(), optype="all-reduce", lane="c", **kw):
    """The opgraph form of a collective member: an arrival marker (its dependencies), then the op."""
    arrive = Node(("arrive", name, rank), (rank, lane), 0.0, "arrive", rank, kw.get("dp", rank),
                  kw.get("stage", 0), tuple(after), marker=True)
    return [arrive, Node((name, rank), (rank, lane), transfer, optype, rank, kw.get("dp", rank),
                         kw.get("stage", 0), (), group=name, kind=optype)]


def path_of(g, durs=None):
    got = g.replay(durs)
    return critical_path(g, got, float(np.max(step_time(got))))


def test_a_chain_is_its_own_critical_path():
    g = StepGraph(0, [node("a", 0, 1.0), node("b", 0, 2.0), node("c", 0, 3.0)])
    assert step_time(g.replay()) == pytest.approx(6.0)
    cp = path_of(g)
    # one rank, one type: one row of 3 ops covering the whole step
    assert cp[["rank", "ops"]].values.tolist() == [[0, 3]]
    assert cp["time_s"].sum() == pytest.approx(6.0)
    assert cp["share_pct"].sum() == pytest.approx(100.0)


def late_collective_step(late=5.0):
    """Three ranks compute 1, 1 and `late` s, then all-reduce (transfer 1 s), then compute 1 s."""
    nodes = []
    for r, c in enumerate((1.0, 1.0, late)):
        nodes += [node("f", r, c)] + collective("ar", r, 1.0) + [node("o", r, 1.0, optype="optimizer")]
    return StepGraph(0, nodes)


def test_one_late_member_delays_every_member_and_the_path_runs_through_it():
    g = late_collective_step()
    got = g.replay()
    # everyone leaves the all-reduce at 5 + 1 and ends at 7
    assert {r: got.lane_end[(r, "c")] for r in range(3)} == pytest.approx({0: 7.0, 1: 7.0, 2: 7.0})
    cp = path_of(g)
    first = cp.iloc[0]
    assert (first["rank"], first["optype"], first["time_s"]) == (2, "compute", pytest.approx(5.0))
    assert cp["optype"].tolist()[1] == "all-reduce" and cp["time_s"].iloc[1] == pytest.approx(1.0)
    assert cp["time_s"].sum() == pytest.approx(7.0)


def test_whatif_names_the_late_rank_and_its_cost():
    steps = [late_collective_step(), late_collective_step()]
    res = analyse(steps)
    s = dict(zip(res["summary"]["figure"], res["summary"]["value"]))
    # typical compute: the mean of 1, 1 and 5 s (paper's rule); the ideal step: 7/3 + 1 + 1
    ideal = (1 + 1 + 5) / 3 + 1 + 1
    assert s["ideal_s"] == pytest.approx(ideal)
    assert s["slowdown"] == pytest.approx(7.0 / ideal)
    assert s["worst worker"] == 2 and s["top dp rank"] == 2
    # rank 2 alone kept as recorded: its 5 s sets the step again (optimizer at typical 1 s)
    w = res["by worker"].set_index("rank")["slowdown"]
    assert w[2] == pytest.approx(7.0 / ideal)
    assert w[0] == pytest.approx(ideal / ideal)    # 1 s < 7/3 s: the others still wait for typical


def test_a_pipeline_bubble_is_paid_for_by_the_stage_before():
    # stage 0 runs F0, F1 (1 s each); stage 1 runs F0', F1' (2 s each), each after its input
    nodes = [node("F0", 0, 1.0, stage=0, dp=0), node("F1", 0, 1.0, stage=0, dp=0),
             node("G0", 1, 2.0, after=[("F0", 0)], stage=1, dp=0),
             node("G1", 1, 2.0, after=[("F1", 0)], stage=1, dp=0)]
    g = StepGraph(0, nodes)
    assert step_time(g.replay()) == pytest.approx(5.0)     # stage 1 idles 0..1: the bubble
    cp = path_of(g)
    assert cp[["rank", "ops"]].values.tolist() == [[0, 1], [1, 2]]
    assert cp["time_s"].tolist() == pytest.approx([1.0, 4.0])


def test_batched_columns_equal_one_replay_per_column():
    g = late_collective_step()
    rng = np.random.default_rng(0)
    durs = rng.uniform(0.5, 3.0, size=(len(g.nodes), 5))
    durs[[n.marker for n in g.nodes]] = 0.0
    batched = step_time(g.replay(durs))
    one_by_one = [step_time(late_collective_step().replay(durs[:, j])) for j in range(5)]
    assert np.allclose(batched, one_by_one)


def test_typical_is_mean_for_compute_and_median_for_comm():
    g = StepGraph(0, [node("a", 0, 1.0), node("a", 1, 2.0), node("a", 2, 6.0)]
                  + collective("x", 0, 1.0) + collective("x", 1, 2.0) + collective("x", 2, 9.0))
    typ = typical_durations([g])
    assert typ["compute"] == pytest.approx(3.0)
    assert typ["all-reduce"] == pytest.approx(4.0)       # not a ByteDance comm type: the mean
    g2 = StepGraph(0, [n if n.marker else Node(n.id, n.lane, n.dur, "grads-reduce-scatter", n.rank,
                                                n.dp, n.stage, n.after, n.group)
                       for n in collective("y", 0, 1.0) + collective("y", 1, 2.0)
                       + collective("y", 2, 9.0)])
    assert typical_durations([g2])["grads-reduce-scatter"] == pytest.approx(2.0)   # median


# ---- bad input, through the command -------------------------------------------------------

def op_table():
    """Two ranks, two steps: a forward compute and an optimizer each."""
    rows = []
    for step in (1, 2):
        for r in (0, 1):
            rows += [dict(dp_rank=r, stage=0, rank=r, step=step, optype="forward-compute",
                          start_ts=0.0, duration=1.0 + r, seq_id=0, mc=0, mb_id=0, gmc=0),
                     dict(dp_rank=r, stage=0, rank=r, step=step, optype="optimizer",
                          start_ts=2.5, duration=0.5, seq_id=0, mc=-1, mb_id=-1, gmc=-1)]
    return pd.DataFrame(rows)


def test_a_small_csv_reports_the_slower_rank(cli_here, tmp_path):
    path = tmp_path / "ops.csv"
    op_table().to_csv(path, index=False)
    p = cli_here("blame", path, "--format", "json", check_rc=0)
    doc = json.loads(p.stdout)
    s = {r["figure"]: r["value"] for r in doc["summary"]}
    # compute typical 1.5 s, optimizer 0.5: ideal 2.0; as recorded rank 1: 2.0 + 0.5
    assert s["slowdown"] == pytest.approx(2.5 / 2.0)
    assert s["worst worker"] == 1
    assert "slowdown" in doc["definitions"]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_missing_column_is_named(cli_here, tmp_path, fmt):
    df = op_table().drop(columns=["duration"])
    path = tmp_path / f"ops.{fmt}"
    df.to_csv(path, index=False) if fmt == "csv" else df.to_parquet(path)
    p = cli_here("blame", path)
    assert p.returncode == 2 and "duration" in p.stderr and "Traceback" not in p.stderr


def test_a_trace_without_step_ids_is_refused(cli_here, tmp_path):
    path = tmp_path / "ops.csv"
    op_table().drop(columns=["step"]).to_csv(path, index=False)
    p = cli_here("blame", path)
    assert p.returncode == 2 and "step" in p.stderr and "Traceback" not in p.stderr


def test_ranks_with_different_steps_name_the_rank(cli_here, tmp_path):
    df = op_table()
    df = df[~((df["rank"] == 1) & (df["step"] == 2))]
    path = tmp_path / "ops.csv"
    df.to_csv(path, index=False)
    p = cli_here("blame", path)
    assert p.returncode == 2 and "rank 1" in p.stderr and "Traceback" not in p.stderr


def test_a_partui_trace_without_steps_is_refused(cli_here, tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "F", "cat": "compute", "pid": 0,
                                                 "tid": 1, "ts": 0, "dur": 5, "args": {}}]}))
    p = cli_here("blame", path)
    assert p.returncode == 2 and "step" in p.stderr and "Traceback" not in p.stderr


# ---- a partui trace: its graph, and its critical path marked for Perfetto -----------------

def X(pid, name, cat, ts_ms, dur_ms, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": 1, "ts": ts_ms * 1e3,
            "dur": dur_ms * 1e3, "args": args}


def late_rank_doc():
    """Rank 0 computes 0-2 ms, issues an all-reduce and waits 2-5.1; rank 1 computes 0-4 ms,
    issues at 4 and waits 4-5.1 (the transfer: 1.1 ms from the last issue); then 0.9 ms each."""
    ar = dict(op="all_reduce", group="dp", bytes=1000, peer=None)
    return {"traceEvents": [
        X(0, "step", "step", 0, 6, step=0), X(1, "step", "step", 0, 6, step=0),
        X(0, "F", "F", 0, 2), X(1, "F", "F", 0, 4),
        X(0, "all_reduce", "comm", 2, 3.1, op_id=1, **ar), X(0, "wait", "wait", 2, 3.1, op_id=1),
        X(1, "all_reduce", "comm", 4, 1.1, op_id=7, **ar), X(1, "wait", "wait", 4, 1.1, op_id=7),
        X(0, "optimizer", "optimizer", 5.1, 0.9), X(1, "optimizer", "optimizer", 5.1, 0.9),
    ], "metadata": {}}


def test_a_partui_trace_blames_the_late_rank_and_marks_its_path(cli_here, tmp_path):
    g = partui_graphs(late_rank_doc())[0]
    # as recorded: rank 1's 4 ms, the 1.1 ms all-reduce, 0.9 ms: the 6 ms step
    assert step_time(g.replay()) == pytest.approx(6.0e-3)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(late_rank_doc()))
    out = tmp_path / "marked.json"
    p = cli_here("blame", path, "--format", "json", "--critical-path", out, check_rc=0)
    doc = json.loads(p.stdout)
    s = {r["figure"]: r["value"] for r in doc["summary"]}
    assert s["worst worker"] == 1
    assert doc["critical path"][0]["rank"] == 1 and doc["critical path"][0]["optype"] == "compute"
    marked = json.loads(out.read_text())["traceEvents"]
    on = {(e["pid"], e["name"]) for e in marked if (e.get("args") or {}).get("critical_path")}
    assert (1, "F") in on and (0, "F") not in on
    flows = [e["ph"] for e in marked if e.get("cat") == "critical_path"]
    assert flows[0] == "s" and flows[-1] == "f" and len(flows) >= 2


def test_parquet_without_pyarrow_says_how_to_get_it(tmp_path, monkeypatch):
    path = tmp_path / "ops.parquet"
    op_table().to_parquet(path)
    monkeypatch.setitem(sys.modules, "pyarrow", None)      # import pyarrow now fails
    with pytest.raises(TraceError, match=r"pip install -e \"\.\[parquet\]\" in the checkout.*csv"):
        read_op_table(str(path))


def test_the_trace_tabs_line_names_the_late_rank_and_its_cost():
    line = blame_line(partui_graphs(late_rank_doc()))
    # rank 1 kept as recorded: 4 + 1.1 + 0.9 ms; typical compute: the fastest rank's (2 ms)
    assert line.startswith("blame: rank 1 is the slowest worker")
    assert "6.0 ms against 4.0 ms" in line and "(+2.0 ms" in line


def test_the_trace_tabs_table_leads_with_the_late_rank():
    lines = blame_text(partui_graphs(late_rank_doc())).splitlines()
    assert lines[0] == blame_line(partui_graphs(late_rank_doc()))
    # rank 1 as recorded: (4 + 1.1 + 0.9) / (2 + 1.1 + 0.9) ms = 1.5, 2 ms over the typical step
    # (one stage and dp 2: stage 0 and compute hold rank 1's lateness alike)
    rows = {ln[:13].strip(): ln[13:].split() for ln in lines[2:6]}
    assert rows == {"dp rank": ["1", "1.50", "+2.0"], "stage": ["0", "1.50", "+2.0"],
                    "op type": ["compute", "1.50", "+2.0"], "worst worker": ["1", "1.50", "+2.0"]}
    assert "every op typical (4.0 ms)" in lines[-1]
