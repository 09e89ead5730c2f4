"""A schedule's in-flight contexts walked from its own actions (Schedule.held_contexts) equal the
count its catalogue record publishes (GPipe M; 1F1B min(P - r, M); Megatron's interleaved warm-up;
ZB1P P; DualPipe P + 1; DualPipeV 2P + 1) for every registered schedule: the walk is what `partui
plan` uses for F&B pairs, which no table publishes."""
import pytest

from planning.pipeline.catalog import SCHEDULES, build_schedule, in_flight, schedule_spec


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("pp, microbatches", [(2, 4), (4, 8), (4, 16), (3, 6)])
def test_the_walk_equals_the_published_count(name, pp, microbatches):
    spec = schedule_spec(name)
    virtual = 2 if spec.virtual else None
    try:
        s = build_schedule(name, pp, microbatches, virtual)
    except ValueError:
        pytest.skip(f"{name} does not run pp {pp} x {microbatches} microbatches")
    for r in range(pp):
        assert s.held_contexts(r) == in_flight(name, pp, r, microbatches, virtual or 1), (name, r)


def test_1f1b_pairs_hold_a_forward_more_and_the_pair_holds_both():
    s = build_schedule("1f1b", 4, 8, None, fb_overlap=True)
    assert [s.held_contexts(r) for r in range(4)] == [8, 6, 4, 2]
    assert [in_flight("1f1b", 4, r, 8, 1, fb_overlap=True) for r in range(4)] == [8, 6, 4, 2]
