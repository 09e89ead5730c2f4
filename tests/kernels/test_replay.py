"""The replay core on hand-built op graphs whose times and critical paths are worked out by hand."""
import pytest

from planning.replay import Dep, Op, Stuck, run


def test_a_chain_on_one_lane_adds_durations_and_its_path_is_the_chain():
    got = run([Op("a", 0, 2.0), Op("b", 0, 3.0), Op("c", 0, 0.5)])
    assert [(got.ops[i].start, got.ops[i].end) for i in "abc"] == [(0, 2), (2, 5), (5, 5.5)]
    assert got.lane_end == {0: 5.5}
    assert got.critical_path("c") == ["a", "b", "c"]


def test_one_late_member_delays_the_whole_collective_and_is_on_every_members_path():
    # lane 0 computes 1, lane 1 computes 4, lane 2 computes 2; then an all-reduce of 1 on all three
    ops = [Op(("x", r), r, d) for r, d in enumerate((1.0, 4.0, 2.0))]
    ops += [Op(("ar", r), r, 1.0, group="ar") for r in range(3)]
    got = run(ops)
    for r in range(3):
        assert got.ops["ar", r].reached == (1.0, 4.0, 2.0)[r]
        assert (got.ops["ar", r].start, got.ops["ar", r].end) == (4.0, 5.0)
    assert got.ops["ar", 0].cause == ("group", ("ar", 1))
    assert got.critical_path(("ar", 0)) == [("x", 1), ("ar", 1), ("ar", 0)]
    assert got.critical_path(("ar", 1)) == [("x", 1), ("ar", 1)]     # it arrived last itself
    assert got.lane_end == {0: 5.0, 1: 5.0, 2: 5.0}


def test_a_recv_waits_for_its_send_plus_the_transfer():
    # lane 0: f (3) then an async send; lane 1: a short g (1), then the compute needing the data
    ops = [Op("f", 0, 3.0), Op("send", 0, holds=False), Op("tail", 0, 1.0),
           Op("g", 1, 1.0), Op("use", 1, 2.0, after=(Dep("send", lag=0.5, at="start"),))]
    got = run(ops)
    assert got.ops["send"].start == 3.0 and got.ops["tail"].start == 3.0   # the send held no time
    assert (got.ops["use"].start, got.ops["use"].end) == (3.5, 5.5)
    assert got.ops["use"].cause == ("dep", "send")
    assert got.critical_path("use") == ["f", "send", "use"]
    assert got.critical_path("g") == ["g"]


def test_a_lazy_async_op_is_settled_when_waited_and_a_stateful_finish_sees_that_order():
    order = []

    def finish(name):
        return lambda t: order.append(name) or t + 1.0

    ops = [Op("a", 0, holds=False, eager=False, finish=finish("a")),
           Op("b", 0, holds=False, eager=True, finish=finish("b")),
           Op("never", 0, holds=False, eager=False, finish=finish("never")),
           Op("wait_a", 0, after=(Dep("a"),), floor=3.0)]
    got = run(ops)
    assert order == ["b", "a"] and got.ops["never"].end is None
    assert got.ops["wait_a"].end == 3.0            # the floor: at least 3 from when it was reached


def test_a_dependency_no_lane_reaches_is_reported_as_stuck():
    with pytest.raises(Stuck, match="lane 1 at use waits for dep missing"):
        run([Op("f", 0, 1.0), Op("use", 1, 1.0, after=(Dep("missing"),))])
    with pytest.raises(Stuck, match="waits for group ar"):
        run([Op("a", 0, group="ar", group_size=2)])
    with pytest.raises(ValueError, match="given twice"):
        run([Op("a", 0), Op("a", 1)])
