"""The engine's own overlap figures (from comm-layer timestamps, no tracer)."""
from kernels.comm import OpRecord
from kernels.engine import StepResult, fill_overlap
from kernels.intervals import intersect, merge, subtract


def test_interval_helpers():
    assert merge([(5, 7), (0, 2), (1, 3)]) == [(0, 3), (5, 7)]
    assert intersect([(0, 10)], [(5, 15), (20, 30)]) == 5
    assert subtract([(0, 10), (20, 30)], [(2, 4), (8, 22), (25, 26)]) == \
        [(0, 2), (4, 8), (22, 25), (26, 30)]


def test_blocked_time_is_not_overlap():
    # compute [0, 100]; an async all-reduce in flight [10, 50] while computing; a blocking
    # all-to-all [60, 90] whose wait covers it: only the first overlaps
    ar = OpRecord(1, "all_reduce", "dp", 8, None, 10, 50)
    a2a = OpRecord(2, "all_to_all", "ep", 8, None, 60, 90, wait_ns=30, waits=[(60, 90)])
    res = StepResult(0, 0.0, 0.0)
    fill_overlap(res, [(0, 100)], [ar, a2a], 0, 100)
    assert res.compute_ms == 70 / 1e6
    assert res.comm_ms == 70 / 1e6
    assert res.overlap_ms == 40 / 1e6
    assert res.wait_ms == 30 / 1e6
