"""Pipeline schedules as data: completeness, order, matched transfers, no deadlock, DualPipe's phases, bad input."""
from dataclasses import replace

import pytest

from planning.pipeline.catalog import SCHEDULE_NAMES, build_schedule
from planning.pipeline.schedules import Action, check_schedule
from planning.pipeline.simulate import Cost, run_dataflow

CASES = ([(n, p, m) for n in ("gpipe", "1f1b", "zb1p") for p in (1, 2, 3, 4, 7) for m in (p, p + 1, 3 * p)]
         + [("interleaved", p, m) for p in (1, 2, 3, 4) for m in (p, 2 * p, 3 * p)]
         + [("dualpipe", p, m) for p in (2, 4, 6, 8) for m in (2 * p, 2 * p + 2, 4 * p)]
         + [("dualpipev", p, m) for p in (1, 2, 3, 4, 5, 8) for m in (2 * p, 2 * p + 1, 3 * p)])


def computes(seq):
    return [a for a in seq if not a.kind.startswith(("SEND", "RECV"))]


@pytest.mark.parametrize("name,pp,mbs", CASES)
def test_every_schedule_validates(name, pp, mbs):
    s = build_schedule(name, pp, mbs)
    check_schedule(s)
    assert len(s.actions) == pp and s.microbatches == mbs


@pytest.mark.parametrize("virtual", [1, 2, 3, 4])
def test_interleaved_validates_and_maps_stages(virtual):
    s = build_schedule("interleaved", 4, 8, virtual=virtual)
    check_schedule(s)
    assert s.stages == 4 * virtual and s.chunks_per_rank == virtual
    assert [s.stage_of(1, c) for c in range(virtual)] == [c * 4 + 1 for c in range(virtual)]


def test_alias_zero_bubble_is_zb1p():
    assert build_schedule("zero-bubble", 4, 8).actions == build_schedule("zb1p", 4, 8).actions


def test_1f1b_rank_order():
    s = build_schedule("1f1b", 4, 6)
    assert [(a.kind, a.mb) for a in computes(s.actions[1])] == [
        ("F", 0), ("F", 1), ("F", 2), ("BW", 0), ("F", 3), ("BW", 1), ("F", 4), ("BW", 2), ("F", 5), ("BW", 3),
        ("BW", 4), ("BW", 5)]
    # the RECV sits right before its consumer, the SEND right after its producer
    seq = s.actions[1]
    i = seq.index(Action("F", 2))
    assert seq[i - 1] == Action("RECV_F", 2, peer=0) and seq[i + 1] == Action("SEND_F", 2, peer=2)


def test_zb1p_defers_rank_r_weight_grads():
    s = build_schedule("zb1p", 4, 8)
    for rank, seq in enumerate(s.actions):
        c = computes(seq)
        assert not any(a.kind == "BW" for a in c)
        # before its k-th B (k from 1), rank r has run max(0, k-1-r) W's: r of them stay deferred to the end
        bs = ws = 0
        for a in c:
            if a.kind == "B":
                bs += 1
                assert ws == max(0, bs - 1 - rank)
            ws += a.kind == "W"
        assert [a.kind for a in c[-rank - 1:]] == ["W"] * (rank + 1)


def test_dualpipe_layout_and_directions():
    s = build_schedule("dualpipe", 4, 16)
    assert s.stages == 4 and s.chunks_per_rank == 2 and s.split_w
    assert [s.stage_of(r, 0) for r in range(4)] == [0, 1, 2, 3]
    assert [s.stage_of(r, 1) for r in range(4)] == [3, 2, 1, 0]
    for seq in s.actions:
        for a in seq:
            for mb, chunk in [(a.mb, a.chunk)] + ([(a.mb2, a.chunk2)] if a.kind == "FB" else []):
                assert (mb >= 8) == (chunk == 1)          # first half through direction 0, second through 1
    # rank 0 feeds direction 0 (no RECV_F for chunk 0), rank 3 feeds direction 1
    assert not any(a.kind == "RECV_F" and a.chunk == 0 for a in s.actions[0])
    assert not any(a.kind == "RECV_F" and a.chunk == 1 for a in s.actions[3])


@pytest.mark.parametrize("pp,mbs", [(4, 8), (8, 24)])
def test_dualpipe_counted_phases(pp, mbs):
    s = build_schedule("dualpipe", pp, mbs)
    half, per_dir = pp // 2, mbs // 2
    for rank, seq in enumerate(s.actions):
        h = min(rank, pp - 1 - rank)
        c = computes(seq)
        first = 0 if rank < half else 1                     # phase 0's chunk: flipped on the second half
        n_f0 = (half - h - 1) * 2
        assert [(a.kind, a.chunk) for a in c[:n_f0]] == [("F", first)] * n_f0                   # 1. nF0
        assert [(a.kind, a.chunk) for a in c[n_f0:n_f0 + 2 * (h + 1)]] == [("F", first), ("F", 1 - first)] * (h + 1)
        main = per_dir - pp + h + 1
        plain = 1 if h == half - 1 else 0                    # middle ranks: first pair not overlapped
        assert sum(a.kind == "FB" for a in c) == 2 * main - plain + (half - h - 1)    # 4. and 5.
        assert sum(a.kind == "B" for a in c) == sum(a.kind == "W" for a in c) == 2 * (half - h - 1) + h + 1
        assert [a.kind for a in c[-(h + 1):]] == ["W"] * (h + 1)                               # 8. nW


def test_dualpipev_layout_local_handoff():
    s = build_schedule("dualpipev", 4, 8)
    assert s.stages == 8 and [s.stage_of(r, 1) for r in range(4)] == [7, 6, 5, 4]
    last = s.actions[3]
    # stage 3 -> stage 4 is local on the last rank: no transfer between rank 3's chunks
    assert s.stage_of(3, 0) + 1 == s.stage_of(3, 1)
    assert not any(a.kind in ("SEND_F", "RECV_F") and a.peer == 3 for a in last)
    assert not any(a.kind == "SEND_F" and a.chunk == 0 for a in last)
    assert not any(a.kind == "RECV_F" and a.chunk == 0 for a in s.actions[0])  # rank 0 feeds the inputs
    assert not any(a.kind == "SEND_B" and a.chunk == 0 for a in s.actions[0])


def _edit(s, rank, fn):
    actions = [list(seq) for seq in s.actions]
    actions[rank] = fn(actions[rank])
    return replace(s, actions=actions)


def test_validate_rejects_broken_schedules():
    s = build_schedule("1f1b", 2, 2)
    with pytest.raises(ValueError, match="pair in order"):       # a SEND without its RECV
        check_schedule(_edit(s, 1, lambda q: [a for a in q if a.kind != "RECV_F"]))
    no_mb0 = _edit(_edit(s, 1, lambda q: [a for a in q if a != Action("RECV_F", 0, peer=0)]),
                   0, lambda q: [a for a in q if a != Action("SEND_F", 0, peer=1)])
    with pytest.raises(ValueError, match="no RECV_F"):          # a forward whose input never travels
        check_schedule(no_mb0)
    with pytest.raises(ValueError, match="missing"):
        check_schedule(_edit(s, 0, lambda q: [a for a in q if a != Action("BW", 1)]))
    with pytest.raises(ValueError, match="twice"):
        check_schedule(_edit(s, 0, lambda q: q + [Action("F", 0)]))
    with pytest.raises(ValueError, match="peer"):
        check_schedule(_edit(s, 0, lambda q: [replace(a, peer=0) if a.kind == "SEND_F" else a for a in q]))
    z = build_schedule("zb1p", 2, 2)
    with pytest.raises(ValueError, match="out of order"):     # a W before its B
        check_schedule(_edit(z, 1, lambda q: [Action("W", 0)] + [a for a in q if a != Action("W", 0)]))


def test_validate_detects_deadlock():
    # gpipe pp 2, 2 mbs, rank 0 waits for mb 0's gradient before sending mb 1's activation: a cycle
    s = build_schedule("gpipe", 2, 2)
    rank0 = [Action("F", 0), Action("SEND_F", 0, peer=1), Action("RECV_B", 0, peer=1), Action("BW", 0),
             Action("F", 1), Action("SEND_F", 1, peer=1), Action("RECV_B", 1, peer=1), Action("BW", 1)]
    with pytest.raises(ValueError, match="deadlock"):
        check_schedule(_edit(s, 0, lambda q: rank0))


def test_fifo_channels_checked():
    s = build_schedule("gpipe", 2, 2)
    swap = lambda q: [Action("RECV_F", 1, peer=0), Action("RECV_F", 0, peer=0)] + [a for a in q if a.kind != "RECV_F"]
    with pytest.raises(ValueError, match="pair in order"):
        check_schedule(_edit(s, 1, swap))


def test_strict_wait_on_sends_deadlocks_dualpipe_not_1f1b():
    # documents the executor contract: sends must not be waited before the next compute
    run_dataflow(build_schedule("1f1b", 4, 8), Cost(), strict=True)
    with pytest.raises(ValueError, match="deadlocks"):
        run_dataflow(build_schedule("dualpipe", 4, 8), Cost(), strict=True)


@pytest.mark.parametrize("name,pp,mbs,virtual,match", [
    ("dualpipe", 3, 12, None, "even pp"),
    ("dualpipe", 4, 6, None, "2 x pp = 8"),
    ("dualpipe", 4, 9, None, "an even number of microbatches"),
    ("dualpipev", 4, 7, None, "microbatches=8"),
    ("1f1b", 4, 3, None, "microbatches=4"),
    ("zb1p", 8, 7, None, "microbatches=8"),
    ("interleaved", 4, 6, 2, "microbatches=8"),
    ("interleaved", 4, 2, 2, "multiple of pp"),
    ("interleaved", 4, 8, 0, "virtual_stages=2"),
    ("1f1b", 4, 8, 2, "drop virtual_stages"),
    ("gpipe", 0, 8, None, "pp must be"),
])
def test_bad_input_names_numbers_and_fix(name, pp, mbs, virtual, match):
    with pytest.raises(ValueError, match=match):
        build_schedule(name, pp, mbs, virtual=virtual)


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError) as e:
        build_schedule("pipedream", 4, 8)
    assert all(n in str(e.value) for n in SCHEDULE_NAMES)
