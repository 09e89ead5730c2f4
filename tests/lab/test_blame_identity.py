"""Blame matches one collective across ranks by its identity (issue 37): the `Comms Id` every
rank of the group records for the same op (Kineto's field, which kernels/comm writes too), else
a collective's `Seq`, else the n-th op on the group. A hand-built trace whose rank 1 issues two
all-reduces in the other order is paired right by identity and wrong by order."""
import copy

import pytest

from partui.analysis.replay.blame import analyse
from partui.analysis.replay.opgraph import step_time
from partui.analysis.replay.partui_graph import partui_graphs


def X(pid, name, cat, ts_ms, dur_ms, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": 1, "ts": ts_ms * 1e3,
            "dur": dur_ms * 1e3, "args": args}


def ar(op_id, comms_id, seq):
    return dict(op="all_reduce", group="dp", bytes=1000, peer=None, op_id=op_id,
                **{"Process Group Name": "dp", "Comms Id": comms_id, "Seq": seq})


def swapped_doc():
    """Two all-reduces on dp, A (Comms Id 11) and B (12). Rank 0 computes to 1 ms, issues A at
    1.0 and B at 1.2, waits A to 4.0 and B to 5.0. Rank 1 computes to 3 ms and issues them the
    other way round: B at 3.0, A at 3.2; it waits B to 5.0 (A is done by then). Both end at 6.
    A: last issue 3.2, rank 0 saw it end at 4.0: 0.8 ms. B: last issue 3.0, rank 1 waited from
    3.2 (after it) to 5.0: 2.0 ms."""
    return {"traceEvents": [
        X(0, "step", "step", 0, 6, step=0), X(1, "step", "step", 0, 6, step=0),
        X(0, "F", "F", 0, 1), X(1, "F", "F", 0, 3),
        X(0, "all_reduce", "comm", 1.0, 3.0, **ar(1, 11, 1)),        # A
        X(0, "all_reduce", "comm", 1.2, 3.8, **ar(2, 12, 2)),        # B
        X(0, "wait", "wait", 1.2, 2.8, op_id=1), X(0, "wait", "wait", 4.0, 1.0, op_id=2),
        X(1, "all_reduce", "comm", 3.0, 2.0, **ar(7, 12, 1)),        # B, its first on dp
        X(1, "all_reduce", "comm", 3.2, 1.8, **ar(8, 11, 2)),        # A
        X(1, "wait", "wait", 3.2, 1.8, op_id=7), X(1, "wait", "wait", 5.0, 0.0, op_id=8),
        X(0, "optimizer", "optimizer", 5.0, 1.0), X(1, "optimizer", "optimizer", 5.0, 1.0),
    ], "metadata": {}}


def without(doc, *fields):
    doc = copy.deepcopy(doc)
    for e in doc["traceEvents"]:
        for f in fields:
            e["args"].pop(f, None)
    return doc


def pairs(g):
    """{op_id on rank 0: (op_id on rank 1, transfer ms)} of each collective the graph holds."""
    spans = {key: v[3] for key, v in g.spans.items() if key[0] == "comm"}
    by_group: dict = {}
    for n in g.nodes:
        if n.group is not None:
            by_group.setdefault(n.group, {})[n.rank] = (spans[n.id], n.dur)
    return {m[0][0]: (m[1][0], round(m[0][1] * 1e3, 6)) for m in by_group.values()}


def test_a_swapped_collective_is_matched_by_its_comms_id():
    g = partui_graphs(swapped_doc())[0]
    assert g.matched_by == "comms id"
    # rank 0's A (op 1) with rank 1's A (op 8), B (2) with B (7); the transfers worked above
    assert pairs(g) == {1: (8, 0.8), 2: (7, 2.0)}
    assert step_time(g.replay()) == pytest.approx(6e-3)


def test_by_order_the_same_trace_pairs_the_wrong_ops():
    # no ids: the n-th all-reduce on dp of each rank is taken for the same op, so rank 0's A
    # pairs with rank 1's B: last issue 3.0, rank 0 saw A end at 4.0, a 1.0 ms transfer
    g = partui_graphs(without(swapped_doc(), "Comms Id", "Seq"))[0]
    assert g.matched_by == "order"
    assert pairs(g) == {1: (7, 1.0), 2: (8, 1.8)}
    # Seq is each rank's own count on the group: a reordered rank's Seq follows its order too
    g = partui_graphs(without(swapped_doc(), "Comms Id"))[0]
    assert g.matched_by == "seq" and pairs(g) == {1: (7, 1.0), 2: (8, 1.8)}


def test_seq_keeps_ops_aligned_where_a_rank_recorded_fewer():
    """Rank 1's first all-reduce (Seq 1) was issued before its step span began, so its trace
    window holds only Seq 2: by Seq it pairs with rank 0's Seq 2; by order, with Seq 1."""
    doc = swapped_doc()
    ev = [e for e in doc["traceEvents"] if not (e["pid"] == 1 and e["cat"] in ("comm", "wait"))]
    ev += [X(1, "all_reduce", "comm", 3.2, 1.8, **ar(8, 12, 2)),
           X(1, "wait", "wait", 3.2, 1.8, op_id=8)]
    doc["traceEvents"] = ev
    g = partui_graphs(without(doc, "Comms Id"))[0]
    assert g.matched_by == "seq"
    grouped = {n.rank: n for n in g.nodes if n.group is not None}
    assert g.spans[grouped[0].id][3] == 2 and g.spans[grouped[1].id][3] == 8
    g = partui_graphs(without(doc, "Comms Id", "Seq"))[0]
    grouped = {n.rank: n for n in g.nodes if n.group is not None}
    assert g.spans[grouped[0].id][3] == 1 and g.spans[grouped[1].id][3] == 8


def test_a_trace_where_only_some_ops_carry_an_id_falls_back_to_order():
    doc = swapped_doc()
    doc["traceEvents"][4]["args"].pop("Comms Id")
    g = partui_graphs(doc)[0]
    assert g.matched_by == "seq"
    assert analyse([g])["summary"].set_index("figure")["value"]["steps"] == 1
