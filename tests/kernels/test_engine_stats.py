"""The engine's own overlap figures (from comm-layer timestamps, no tracer)."""
from kernels.comm import OpRecord
from kernels.engine import StepResult, fill_overlap
from planning.intervals import figures, intersect, merge, pair_p2p, subtract


def test_interval_helpers():
    assert merge([(5, 7), (0, 2), (1, 3)]) == [(0, 3), (5, 7)]
    assert intersect([(0, 10)], [(5, 15), (20, 30)]) == 5
    assert subtract([(0, 10), (20, 30)], [(2, 4), (8, 22), (25, 26)]) == \
        [(0, 2), (4, 8), (22, 25), (26, 30)]


def test_blocked_time_is_not_overlap():
    # leaf compute [0, 100] inside a microbatch container [0, 120] (never compute); an async
    # all-reduce in flight [10, 50], posted during [10, 12]; a blocking all-to-all [60, 90]
    # whose wait covers it: only the first overlaps, less its posting
    ar = OpRecord(1, "all_reduce", "dp", 8, None, 10, 50, post=(10, 12))
    a2a = OpRecord(2, "all_to_all", "ep", 8, None, 60, 90, wait_ns=30, waits=[(60, 90)])
    res = StepResult(0, 0.0, 0.0)
    spans = [("layer", 0, 100), ("microbatch", 0, 120), ("step", 0, 130)]
    fill_overlap(res, spans, [ar, a2a], 0, 130)
    assert res.compute_ms == 68 / 1e6          # 100 - 30 blocked - 2 posting
    assert res.comm_ms == 70 / 1e6
    assert res.overlapped_ms == 38 / 1e6       # [12, 50]
    assert res.exposed_comm_ms == 32 / 1e6
    assert res.wait_ms == 32 / 1e6


def test_figures_cut_to_the_window_and_count_each_time_once():
    # two nested leaf spans, a wait span inside them, an op in flight past the window's end
    f = figures([(0, 50), (10, 20), (40, 80)], [(70, 200)], [(15, 25)], 0, 100)
    assert f == {"window": 100, "compute": 70, "comm": 30, "overlapped": 10, "exposed": 20,
                 "wait": 10}


def test_p2p_pairs_as_a_trace_pairs_them():
    # rank 0 sends twice to rank 1 (tag 0); gloo sees each send done only at the step's end (100).
    # rank 1 posted its first recv early (at 5, before the send at 10), done at 30; the second
    # recv posted at 60 after the send at 50, done at 70. A send to rank 2 has no recv: untouched.
    sends = [("send", 1, 0, 10, 100), ("send", 1, 0, 50, 100), ("send", 2, 0, 20, 100)]
    recvs = [("recv", 0, 0, 5, 30), ("recv", 0, 0, 60, 70)]
    paired = pair_p2p([sends, recvs, []])
    assert paired[0] == [(10, 30), (50, 70), (20, 100)]    # each send ends at its recv's end
    assert paired[1] == [(11, 30), (60, 70)]                   # an early recv starts after its send
    assert paired[2] == []


def test_parts_that_crossed_a_process_as_json_give_the_same_figures():
    import json
    from planning.intervals import parts_figures, window_parts
    # compute [0,45] [48,50] [60,90] (a wait at 45-48); in flight [40,70] and a p2p [80,95]:
    # overlapped 5 + 2 + 10 + 10
    parts = window_parts([(0, 50), (60, 90)], [(40, 70)], [(45, 48)], 0, 100)
    again = json.loads(json.dumps(parts))              # torchrun's gather: tuples become lists
    assert parts_figures(again, [[80, 95]]) == parts_figures(parts, [(80, 95)]) == \
        {"window": 100, "compute": 77, "comm": 45, "overlapped": 27, "exposed": 18, "wait": 3}
