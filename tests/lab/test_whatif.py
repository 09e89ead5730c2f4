"""`partui whatif`: the replay of a hand-built two-rank trace whose answer is worked by hand, a
p2p pair, and the command's bad input (exit 2, one line)."""
import json

import pytest

from planning.link import build_link
from partui.analysis.replay.whatif import on_own_cores, programs, replay, saved, simulate, without_overlap
from partui.bench.whatif import equal_busy_error_pct


def X(pid, name, cat, ts_ms, dur_ms, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": 1, "ts": ts_ms * 1e3,
            "dur": dur_ms * 1e3, "args": args}


def all_reduce_doc():
    """Rank 0 issues a 1 MB all-reduce at 2 ms and waits at 5 ms; rank 1 issues at 4 ms and waits
    at once. Both steps are 6 ms long (the recorded waits end at 5.1 ms)."""
    ar = dict(op="all_reduce", group="dp", bytes=1_000_000, peer=None)
    return {"traceEvents": [
        X(0, "step", "step", 0, 6, step=0), X(1, "step", "step", 0, 6, step=0),
        X(0, "all_reduce", "comm", 2, 3.1, op_id=1, **ar), X(0, "wait", "wait", 5, 0.1, op_id=1),
        X(1, "all_reduce", "comm", 4, 1.1, op_id=7, **ar), X(1, "wait", "wait", 4, 1.1, op_id=7),
    ], "metadata": {}}


def test_a_collective_replays_from_the_last_issue_with_the_link_cost():
    # 2 ranks, 1 GB/s, no latency: 2 * (1/2) * 1e6 B / 1e9 B/s = 1 ms, from rank 1's issue at 4 ms
    # (the link alone: gloo's recorded 1.1 ms is the next test's)
    t = replay(all_reduce_doc(), build_link("alpha_us=0,gbps=1"), link_only=True).set_index("rank")
    # rank 0: busy 0-5, the op ended at 5: no wait, then 0.9 ms busy; rank 1: waits 4-5, 0.9 busy
    assert t.loc[0, "predicted_step_ms"] == pytest.approx(5.9)
    assert t.loc[1, "predicted_step_ms"] == pytest.approx(5.9)
    assert t.loc[0, "blocked_ms"] == pytest.approx(0.0)
    assert t.loc[1, "blocked_ms"] == pytest.approx(1.0)
    assert t.loc[0, "comm_in_flight_ms"] == pytest.approx(3.0)     # 2 ms to 5 ms
    assert t.loc[0, "busy_overlap_pct"] == pytest.approx(100.0)
    assert t.loc[1, "busy_overlap_pct"] == pytest.approx(0.0)
    assert t.loc[0, "recorded_step_ms"] == pytest.approx(6.0)
    # compute twice as slow: rank 0 is busy until 10 ms, the op (from 8 ms) ended at 9 ms
    t2 = replay(all_reduce_doc(), build_link("alpha_us=0,gbps=1"), compute_scale=2.0,
                link_only=True)
    assert t2.set_index("rank").loc[0, "predicted_step_ms"] == pytest.approx(10 + 1.8)


def test_a_collective_ends_no_sooner_than_gloo_delivered_it():
    # the recorded op ended 1.1 ms after its last member's issue (rank 1's, at 4 ms; rank 0's own
    # 3.1 ms from 2 ms waited on rank 1): the live emulation holds an op to max(link, gloo), so a
    # 1 ms link ends it at 5.1 ms, from the replayed start
    fast = build_link("alpha_us=0,gbps=1")
    t = replay(all_reduce_doc(), fast).set_index("rank")
    # rank 0: busy to 5, waits to 5.1, 0.9 busy; rank 1: waits 4-5.1, 0.9 busy
    assert t.loc[0, "predicted_step_ms"] == pytest.approx(6.0)
    assert t.loc[1, "predicted_step_ms"] == pytest.approx(6.0)
    assert t.loc[0, "blocked_ms"] == pytest.approx(0.1)
    assert t.loc[1, "blocked_ms"] == pytest.approx(1.1)
    # compute twice as slow: the op starts at rank 1's issue at 8 ms, gloo's 1.1 ms ends it at
    # 9.1; rank 1 waits to 9.1 then 1.8 ms busy
    t2 = replay(all_reduce_doc(), fast, compute_scale=2.0).set_index("rank")
    assert t2.loc[1, "predicted_step_ms"] == pytest.approx(9.1 + 1.8)
    # a 0.5 GB/s link (2 ms, from 4 ms) is slower than gloo: the link's end decides, as link_only
    slow = build_link("alpha_us=0,gbps=0.5")
    assert replay(all_reduce_doc(), slow)["predicted_step_ms"].tolist() == pytest.approx(
        replay(all_reduce_doc(), slow, link_only=True)["predicted_step_ms"].tolist())
    assert replay(all_reduce_doc(), slow)["predicted_step_ms"].tolist() == pytest.approx([6.9, 6.9])
    # one device per rank (on_own_cores) is the link alone: gloo's time here is not a cluster's
    own = simulate(on_own_cores(all_reduce_doc(), programs(all_reduce_doc())), fast)[0]
    assert own["predicted_step_ms"].tolist() == pytest.approx([5.9, 5.9])


def test_a_wait_keeps_its_own_time_past_its_op():
    # the all-reduce of all_reduce_doc (ended 5.1 ms, gloo's 1.1 ms after rank 1's issue at 4 ms);
    # rank 0 now waits at 5.5 ms for 0.2 ms on the op already done (the call's own host work),
    # rank 1 waits 4-5.15 ms: it woke 0.05 ms after the op's end. Both steps 6 ms.
    ar = dict(op="all_reduce", group="dp", bytes=1_000_000, peer=None)
    doc = {"traceEvents": [
        X(0, "step", "step", 0, 6, step=0), X(1, "step", "step", 0, 6, step=0),
        X(0, "all_reduce", "comm", 2, 3.1, op_id=1, **ar), X(0, "wait", "wait", 5.5, 0.2, op_id=1),
        X(1, "all_reduce", "comm", 4, 1.1, op_id=7, **ar), X(1, "wait", "wait", 4, 1.15, op_id=7),
    ], "metadata": {}}
    assert programs(doc)[0]["items"][3] == ("wait", 1, pytest.approx(200), pytest.approx(200))
    assert programs(doc)[1]["items"][3] == ("wait", 7, pytest.approx(1150), pytest.approx(50))
    # 1 GB/s: the op ends at 5.1 (gloo's); rank 0 busy to 5.5, waits 0.2, busy 0.3: 6.0;
    # rank 1 waits to 5.1 + 0.05, busy 0.85: 6.0 (the recording, as the link is not the slower)
    t = replay(doc, build_link("alpha_us=0,gbps=1")).set_index("rank")
    assert t["predicted_step_ms"].tolist() == pytest.approx([6.0, 6.0])
    assert t["blocked_ms"].tolist() == pytest.approx([0.2, 1.15])
    # the link alone: no gloo floor, no own time: rank 0 5.5 + 0.3, rank 1 5.0 + 0.85
    lone = replay(doc, build_link("alpha_us=0,gbps=1"), link_only=True)
    assert lone["predicted_step_ms"].tolist() == pytest.approx([5.8, 5.85])
    # 0.5 GB/s: the op ends at 4 + 2 = 6 ms; rank 0 waits 5.5-6 + 0.2, then 0.3: 6.5;
    # rank 1 waits 4-6 + 0.05, then 0.85: 6.9
    slow = replay(doc, build_link("alpha_us=0,gbps=0.5")).set_index("rank")
    assert slow["predicted_step_ms"].tolist() == pytest.approx([6.5, 6.9])
    assert slow["blocked_ms"].tolist() == pytest.approx([0.7, 2.05])


def p2p_doc(recv: tuple, wait: tuple, **recv_args) -> dict:
    """Rank 0 sends 1 MB at 1 ms (1 GB/s + 100 us: ends 2.1 ms) and waits at 1.2 ms; rank 1's
    recv slice is `recv` (ts, dur ms) and its wait `wait`; both steps 3 ms."""
    p2p = dict(bytes=1_000_000, group="pp", tag=0)
    return {"traceEvents": [
        X(0, "step", "step", 0, 3, step=0), X(1, "step", "step", 0, 3, step=0),
        X(0, "send", "comm", 1, 0.5, op_id=1, op="send", peer=1, **p2p),
        X(0, "wait", "wait", 1.2, 0.3, op_id=1),
        X(1, "recv", "comm", *recv, op_id=1, op="recv", peer=0, **p2p, **recv_args),
        X(1, "wait", "wait", *wait, op_id=1),
    ], "metadata": {}}


def test_a_recv_ends_with_its_send():
    # rank 1 posted its recv at 0 ms and waited from 0.5 ms
    t = replay(p2p_doc((0, 1.5), (0.5, 1.0)), build_link("alpha_us=100,gbps=1")).set_index("rank")
    # rank 0: busy 1.2, waits to 2.1, then 3 - 1.5 = 1.5 busy: 3.6; rank 1: 0.5 busy, waits to
    # 2.1, then 3 - 1.5 = 1.5 busy: 3.6
    assert t.loc[0, "predicted_step_ms"] == pytest.approx(3.6)
    assert t.loc[1, "predicted_step_ms"] == pytest.approx(3.6)
    assert t.loc[1, "blocked_ms"] == pytest.approx(1.6)


def test_a_recv_posted_before_its_send_keeps_its_wait():
    # the stitcher starts a recv posted early at its send's post (posted_early_us back to the
    # real post); rank 1 posted at 0 and waited from 0.5 ms: the replay must see that wait
    doc = p2p_doc((1.001, 1.099), (0.5, 1.6), posted_early_us=1001)
    t = replay(doc, build_link("alpha_us=100,gbps=1")).set_index("rank")
    # rank 1: 0.5 ms busy, waits until the send's end at 2.1 ms, then 0.9 ms busy
    assert t.loc[1, "predicted_step_ms"] == pytest.approx(3.0)
    assert t.loc[1, "blocked_ms"] == pytest.approx(1.6)


def test_whatif_bad_input_exits_2(cli_here, tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(all_reduce_doc()))
    p = cli_here("whatif", path)
    assert p.returncode == 2 and "--link" in p.stderr
    p = cli_here("whatif", path, "--link", "h900")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--link h900" in p.stderr
    p = cli_here("whatif", path, "--link", "alpha_us=0,gbps=1", "--format", "json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["step"]["predicted_step_ms"] == pytest.approx(6.0)     # gloo's 1.1 ms held
    assert [r["predicted_step_ms"] for r in out["ranks"]] == pytest.approx([6.0, 6.0])
    p = cli_here("whatif", path, "--link", "alpha_us=0,gbps=1", "--link-only", "--format", "json")
    assert json.loads(p.stdout)["step"]["predicted_step_ms"] == pytest.approx(5.9)   # the link's 1 ms


def test_run_rejects_a_bad_link_before_launching(cli_here):
    p = cli_here("run", "--dp", "2", "--link", "alpha_us=1")
    assert p.returncode == 2 and "--link alpha_us=1 needs both" in p.stderr
    p = cli_here("run", "--dp", "2", "--link", "h800", "--ranks-per-node", "3")
    assert p.returncode == 2 and "--ranks-per-node 3 must be >= 1 and divide world 2" in p.stderr


def test_without_overlap_waits_each_op_right_after_its_issue():
    # rank 0 issued at 2 ms and computed 3 ms before waiting; serialized it waits at 2 ms until
    # the op ends (rank 1's issue at 4 ms + 1 ms = 5 ms), then computes those 3 ms and 0.9 ms more
    link = build_link("alpha_us=0,gbps=1")
    t = replay(all_reduce_doc(), link, overlap=False, link_only=True).set_index("rank")
    assert t.loc[0, "predicted_step_ms"] == pytest.approx(5 + 3 + 0.9)
    assert t.loc[0, "blocked_ms"] == pytest.approx(3.0)
    assert t.loc[1, "predicted_step_ms"] == pytest.approx(5.9)      # it already waited at once
    # saved holds the op to gloo's recorded 1.1 ms too: it ends at 5.1 ms either way
    s = saved(all_reduce_doc(), link).set_index("rank")
    assert s.loc[0, "saved_ms"] == pytest.approx(3.0) and s.loc[1, "saved_ms"] == pytest.approx(0)
    assert s.loc[0, "comm_in_flight_ms"] == pytest.approx(3.1)           # 2 ms to 5.1 ms
    assert s.loc["step", "predicted_step_ms"] == pytest.approx(6.0)
    assert s.loc["step", "no_overlap_step_ms"] == pytest.approx(9.0)
    assert s.loc["step", "saved_ms"] == pytest.approx(3.0)
    assert list(s.attrs["definitions"]) == ["rank", "comm_in_flight_ms", "blocked_ms",
                                            "predicted_step_ms", "no_overlap_step_ms", "saved_ms"]


def test_a_recv_keeps_its_place_without_overlap():
    doc = {"traceEvents": [
        X(0, "step", "step", 0, 3, step=0), X(1, "step", "step", 0, 3, step=0),
        X(0, "send", "comm", 1, 0.5, op_id=1, op="send", peer=1, bytes=1_000_000, group="pp"),
        X(0, "wait", "wait", 2.5, 0.1, op_id=1),
        X(1, "recv", "comm", 0, 2.0, op_id=4, op="recv", peer=0, bytes=1_000_000, group="pp"),
        X(1, "wait", "wait", 1.5, 0.6, op_id=4),
    ], "metadata": {}}
    progs = without_overlap(programs(doc))
    assert [it[0] for it in progs[0]["items"]] == ["busy", "issue", "wait", "busy", "busy"]
    assert [it[0] for it in progs[1]["items"]] == ["busy", "issue", "busy", "wait", "busy"]
    # 1 GB/s, no latency: the send moves 1 ms from its issue at 1 ms; rank 0 now waits for it,
    # then computes what it computed beside it (1.5 ms) and after its old wait (0.4 ms); the moved
    # wait keeps the old one's own 0.1 ms (2.5-2.6 ms, on a send recorded done at 1.5 ms)
    t = replay(doc, build_link("alpha_us=0,gbps=1"), overlap=False).set_index("rank")
    assert progs[0]["items"][2] == ("wait", 1, 0.0, pytest.approx(100))
    assert t.loc[0, "predicted_step_ms"] == pytest.approx(2 + 0.1 + 1.5 + 0.4)
    # the recv ends at 2 ms; its wait returned 0.1 ms past the recorded end (2.1): kept
    assert t.loc[1, "predicted_step_ms"] == pytest.approx(3 - 2.1 + 2.0 + 0.1)


def test_bench_error_at_equal_busy_takes_the_windows_busy_gap_out():
    # predicted 90 from a plain window busy 60; the linked window measured 110 but was busy 70:
    # 10 ms of it another job's, so as busy as the plain one it would have run 100: -10%
    assert equal_busy_error_pct(90.0, 110.0, 60.0, 70.0) == pytest.approx(100 * (90 - 100) / 110)
    assert equal_busy_error_pct(100.0, 100.0, 50.0, 50.0) == 0.0
