"""The array replay (partui/analysis/replay/graph_replay.py) against the event loop of planning/replay.py,
the independent oracle: random step graphs (lanes, dependencies, collectives, async ops waited
later) replayed both ways give the same step time bit for bit, column by column; the kept-column
replay (only one label value recorded, the rest typical) equals the dense replay of the same
columns; a cycle is refused naming the step."""
import os

import numpy as np
import pytest

from partui.analysis.replay.blame import analyse
from partui.analysis.table.events import TraceError
from partui.analysis.replay.graph_replay import ReplayPlan, replay_dense, replay_one_kept
from partui.analysis.replay.opgraph import Node, StepGraph, step_time


def random_graph(seed, ranks=5, ops=12):
    """Per rank one lane: compute ops, collectives across random rank subsets (an arrival
    marker then the op), async sends waited later, and dependencies on other ranks' ops."""
    rng = np.random.default_rng(seed)
    nodes, done = [], []
    groups = {}
    for i in range(ops):
        kind = rng.choice(["compute", "coll", "async"])
        if kind == "coll":
            members = sorted(rng.choice(ranks, size=rng.integers(2, ranks + 1), replace=False))
            groups[i] = members
        for r in range(ranks):
            lane, dp, st = (r, "main"), r % 2, r // 2
            after = tuple(x for x in done if x[1] != r and rng.random() < 0.15)
            if kind == "coll" and r in groups[i]:
                nodes.append(Node(("arrive", r, i), lane, 0.0, "arrive", r, dp, st, after,
                                  marker=True))
                nodes.append(Node(("c", r, i), lane, float(rng.random()), "coll", r, dp, st,
                                  group=("g", i), kind="coll"))
            elif kind == "async":
                nodes.append(Node(("a", r, i), lane, float(rng.random()), "send", r, dp, st,
                                  after, holds=False, eager=False, kind="send"))
                nodes.append(Node(("w", r, i), lane, 0.0, "wait", r, dp, st, (("a", r, i),),
                                  marker=True))
            else:
                nodes.append(Node(("f", r, i), lane, float(rng.random()), "compute", r, dp, st,
                                  after, kind="compute"))
                done.append(("f", r, i))
    return StepGraph(0, nodes)


@pytest.mark.parametrize("seed", range(12))
def test_levels_replay_as_the_event_loop_does(seed):
    g = random_graph(seed)
    t = g.table
    rng = np.random.default_rng(100 + seed)
    durs = rng.random((len(t), 4)) * (~t.marker)[:, None]
    durs[:, 0] = t.dur
    plan = ReplayPlan(t)
    got, _e = replay_dense(plan, durs, g.lane_starts())
    for j in range(durs.shape[1]):
        want = step_time(g.replay(durs[:, j]))
        assert got[j] == want                   # max and one addition per op: bit for bit


@pytest.mark.parametrize("seed", range(6))
def test_kept_columns_equal_the_dense_columns(seed):
    g = random_graph(seed, ranks=6, ops=16)
    t = g.table
    rng = np.random.default_rng(seed)
    ide = rng.random(len(t)) * (~t.marker)
    rec = rng.random((len(t), 3)) * 2 * (~t.marker)[:, None]       # three steps' recorded
    plan = ReplayPlan(t)
    starts = g.lane_starts()
    _t, e0 = replay_dense(plan, ide[:, None], starts)
    values = sorted(set(t.rank.tolist()))
    got = replay_one_kept(plan, e0[:, 0], ide, rec, t.rank, values, block=4)
    for i, v in enumerate(values):
        for s in range(3):
            want, _e = replay_dense(plan, np.where(t.rank == v, rec[:, s], ide)[:, None], starts)
            assert got[i, s] == want[0]


def test_a_cycle_is_refused_naming_the_step():
    nodes = [Node(("a", 0), (0, "m"), 1.0, "compute", 0, 0, 0, (("b", 1),), kind="compute"),
             Node(("b", 1), (1, "m"), 1.0, "compute", 1, 1, 0, (("a", 0),), kind="compute")]
    with pytest.raises(TraceError, match="step 3: the dependency graph cannot be replayed"):
        analyse([StepGraph(3, nodes)])


def test_blame_reads_the_same_whichever_way_kept_columns_replay(monkeypatch):
    """by worker and by dp rank: changed rows only (many values) or dense (few), same figures."""
    from partui.analysis.replay import blame
    graphs = [random_graph(7, ranks=6, ops=16) for _ in range(2)]
    for g in graphs:
        g.recorded = 10.0
    monkeypatch.setattr(blame, "KEPT_FROM", 0)
    sparse = analyse(graphs)
    for g in graphs:
        g.plan = None
    monkeypatch.setattr(blame, "KEPT_FROM", 10**6)
    dense = analyse(graphs)
    for section in ("summary", "by dp rank", "by worker", "by stage", "by op type"):
        assert sparse[section].equals(dense[section]), section


REAL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "real-traces",
                    "bytedance-straggler", "trace-SE.parquet")


@pytest.mark.skipif(not os.path.isfile(REAL), reason="../shared/real-traces is absent")
def test_a_real_jobs_what_ifs_equal_the_event_loops():
    """ByteDance's SE job (64 workers): each step as recorded, and one worker's what-if (only its
    ops recorded, the rest typical: the changed-rows replay), against the event loop, bit for bit."""
    from partui.analysis.replay.blame import recorded_per_node, typical_durations, typical_per_node
    from partui.analysis.replay.bytedance_graph import bytedance_graphs
    from partui.analysis.reading.op_table import read_op_table
    graphs = bytedance_graphs(read_op_table(REAL))[:3]
    typ = typical_durations(graphs)
    t = graphs[0].table
    plan = ReplayPlan(t)
    starts = graphs[0].lane_starts()
    ide = typical_per_node(t, typ)
    rec = np.stack([recorded_per_node(g.table, typ) for g in graphs], axis=1)
    _t, e0 = replay_dense(plan, ide[:, None], starts)
    got = replay_one_kept(plan, e0[:, 0], ide, rec, t.rank, [80])
    for s, g in enumerate(graphs):
        dense, _e = replay_dense(plan, rec[:, [s]], starts)
        assert dense[0] == step_time(g.replay(rec[:, s]))
        assert got[0, s] == step_time(g.replay(np.where(t.rank == 80, rec[:, s], ide)))
