"""Tracing does not disturb what it measures (issue 33 item 1).

The stall: a rank's first full cyclic-GC collection walked the ~170k objects it was forked with
(torch's modules) for 110-440 ms, set off by a traced step's allocations, inside whatever layer ran.
partui.world.rank freezes the inherited heap at the rank's start; the trace shows every collection on the
rank's "gc" track (partui.recording.trace), so a pause is seen, not read as compute."""
import gc
import json
import statistics

import pytest

from partui.world.world import World

pytestmark = pytest.mark.timeout(300)


def _gc_walk(rank, size):
    """What a full collection of this one-shot rank would walk, and what it never will."""
    return len(gc.get_objects()), gc.get_freeze_count()


def test_a_rank_collects_only_what_it_made(gloo_world):
    # the test process has torch imported, so each forked rank inherits its whole heap
    inherited = len(gc.get_objects())
    assert inherited > 50_000
    for walked, frozen in gloo_world(2, _gc_walk, timeout_s=120):
        assert frozen >= inherited * 0.9, (frozen, inherited)
        assert walked < inherited * 0.1, (walked, inherited)


ROUNDS = 5


@pytest.fixture(scope="module")
def traced_pipeline(tmp_path_factory):
    """A held 1F1B pipeline world stepping untraced, untraced, traced, traced, ... (the stall hit a
    window's second traced step); every traced step is read against the four untraced steps around
    its pair, so a machine whose load moves during the run still compares like with like."""
    steps = []  # (traced, step_ms)
    with World(timeout_s=120) as w:
        w.plan("custom", "tiny", pp=2, schedule="1f1b", microbatches=4)
        w.launch()
        w.step(1)  # warm-up
        for _ in range(ROUNDS):
            steps += [(False, ln["step_ms"]) for ln in w.step(2)]
            w.trace_on()
            steps += [(True, ln["step_ms"]) for ln in w.step(2)]
            w.trace_off()
        steps += [(False, ln["step_ms"]) for ln in w.step(2)]
        path = w.trace_save(str(tmp_path_factory.mktemp("undisturbed") / "pp.json"), command="test")
    with open(path) as f:
        return steps, json.load(f)["traceEvents"]


def around(steps, i):
    """The median of the untraced steps of the rounds either side of traced step i."""
    pair = i - (i % 4 == 3)                    # the pair's first step: i or i - 1
    return statistics.median(ms for _, ms in steps[pair - 2:pair] + steps[pair + 2:pair + 4])


def test_no_traced_step_takes_twice_the_untraced_median(traced_pipeline):
    steps, _ = traced_pipeline
    for i, (traced, ms) in enumerate(steps):
        if traced:
            assert ms <= 2 * around(steps, i), (
                f"traced step {i} took {ms:.1f} ms against {around(steps, i):.1f} ms untraced "
                f"around it: {steps}")


def test_every_collection_is_on_the_gc_track_and_short(traced_pipeline):
    steps, events = traced_pipeline
    median = statistics.median(ms for traced, ms in steps if not traced)
    collections = [e for e in events if e.get("cat") == "gc"]
    assert collections, "the recorder saw no collection in 10 traced steps"
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    assert {names[e["pid"], e["tid"]] for e in collections} == {"gc"}
    longest = max(collections, key=lambda e: e["dur"])
    assert longest["dur"] / 1000 < median / 4, (longest, median)
