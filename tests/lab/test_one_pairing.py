"""One p2p pairing (issue 32): the trace's send -> recv slices (partui.recording.tracefile) and the step
line's paired figures (planning.intervals.pair_p2p) come from planning.intervals.match_p2p and
paired_spans, so one set of ops gives the same intervals both ways."""
from __future__ import annotations

from partui.recording.tracefile import build_doc
from planning.intervals import match_p2p, pair_p2p

# rank 0 sends twice to rank 1 (tag 0), each seen done only at 100 µs; rank 1 posted its first recv
# early (at 5, before the send at 10), done at 30; the second at 60 after the send at 50, done at
# 70. Rank 0's send to rank 2 with tag 1 meets a recv with tag 0: no pair.
OPS = [[("send", 1, 0, 10, 100), ("send", 1, 0, 50, 100), ("send", 2, 1, 20, 100)],
       [("recv", 0, 0, 5, 30), ("recv", 0, 0, 60, 70)],
       [("recv", 0, 0, 25, 90)]]


def trace_of(ops_by_rank):
    per_rank = [{"rank": r, "t0_us": 0, "t1_us": 100,
                 "events": [{"ph": "X", "cat": "comm", "pid": r, "tid": 2, "name": op, "ts": float(a),
                             "dur": float(b - a), "args": {"op": op, "peer": peer, "tag": tag}}
                            for op, peer, tag, a, b in ops]} for r, ops in enumerate(ops_by_rank)]
    return build_doc(per_rank)


def test_match_pairs_the_kth_send_with_the_kth_recv_of_its_key_in_issue_order():
    ops = [("send", 0, 1, 0, 50), ("send", 0, 1, 0, 10), ("recv", 1, 0, 0, 60), ("recv", 1, 0, 0, 5),
           ("send", 0, 2, 1, 20), ("recv", 2, 0, 0, 25)]
    assert match_p2p(ops) == [(1, 3), (0, 2)]


def test_the_trace_and_the_step_figures_pair_alike():
    doc = trace_of(OPS)
    slices = {(e["pid"], e["args"]["op"], e["args"]["peer"], e["args"]["tag"], i): e
              for i, e in enumerate(ev for ev in doc["traceEvents"] if ev.get("ph") == "X")}
    traced = [[], [], []]
    for (rank, *_), e in slices.items():
        traced[rank].append((round(e["ts"], 3), round(e["ts"] + e["dur"], 3)))
    paired = pair_p2p([[(op, peer, tag, a * 1000, b * 1000) for op, peer, tag, a, b in ops] for ops in OPS])
    in_us = [[(a / 1000, b / 1000) for a, b in ops] for ops in paired]
    assert traced == in_us == [[(10, 30), (50, 70), (20, 100)], [(10.001, 30), (60, 70)], [(25, 90)]]


def test_the_trace_marks_what_pairing_moved_and_draws_one_arrow_a_pair():
    evs = [e for e in trace_of(OPS)["traceEvents"] if e.get("ph") == "X"]
    assert [e["args"].get("end") for e in evs] == ["recv", "recv", None, None, None, None]
    assert [e["args"].get("posted_early_us") for e in evs] == [None, None, None, 5.001, None, None]
    assert [(e.get("bind_id"), e.get("flow_out", False), e.get("flow_in", False)) for e in evs] == \
        [(1, True, False), (2, True, False), (None, False, False), (1, False, True), (2, False, True),
         (None, False, False)]
