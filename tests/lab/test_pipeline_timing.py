"""The simulator fed a pipeline trace's own timing (partui.analysis.figures.timing), on a hand-built
1F1B trace of 2 ranks x 2 microbatches whose answers are computed by hand (times in us)."""
import json

import pytest

from partui.analysis import load, overlap
from partui.analysis.table.sweep import windows_of
from partui.recording import tracefile
from partui.analysis.figures.timing import step_timings


def X(rank, name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": rank, "tid": tid, "ts": ts, "dur": dur, "args": args}


def trace(tmp_path):
    ev = [X(r, "step", "step", 0, 200, step=0) for r in (0, 1)]
    # rank 0: a forward's span holds its send's post; a backward's its wait for the gradient
    ev += [X(0, "F mb0 c0", "F", 0, 13, mb=0, chunk=0), X(0, "post send", "post", 10, 3, op="send"),
           X(0, "F mb1 c0", "F", 14, 13, mb=1, chunk=0), X(0, "post send", "post", 24, 3, op="send"),
           X(0, "post recv", "post", 27, 1, op="recv"),
           X(0, "BW mb0 c0", "B", 29, 37, mb=0, chunk=0), X(0, "wait recv", "wait", 29, 17, op="recv"),
           X(0, "post recv", "post", 66, 1, op="recv"),
           X(0, "BW mb1 c0", "B", 68, 29, mb=1, chunk=0), X(0, "wait recv", "wait", 68, 9, op="recv")]
    ev += [X(1, "post recv", "post", 0, 1, op="recv"),
           X(1, "F mb0 c0", "F", 3, 21, mb=0, chunk=0), X(1, "wait recv", "wait", 3, 13, op="recv"),
           X(1, "BW mb0 c0", "B", 24, 18, mb=0, chunk=0), X(1, "post send", "post", 40, 2, op="send"),
           X(1, "post recv", "post", 42, 1, op="recv"),
           X(1, "F mb1 c0", "F", 45, 8, mb=1, chunk=0),
           X(1, "BW mb1 c0", "B", 55, 18, mb=1, chunk=0), X(1, "post send", "post", 71, 2, op="send")]
    # the recvs' in-flight slices; transfer_us where the receiver already waited (the merge writes it)
    ev += [X(1, "recv", "comm", 10, 6, tid=2, op="recv", peer=0, transfer_us=6.0),
           X(1, "recv", "comm", 42, 3, tid=2, op="recv", peer=0),
           X(0, "recv", "comm", 40, 6, tid=2, op="recv", peer=1, transfer_us=6.0),
           X(0, "recv", "comm", 71, 6, tid=2, op="recv", peer=1, transfer_us=6.0)]
    names = [{"ph": "M", "name": "thread_name", "pid": r, "tid": t, "args": {"name": n}}
             for r in (0, 1) for t, n in ((1, "compute"), (2, "comm"))]
    path = tmp_path / "pp.json"
    path.write_text(json.dumps({"traceEvents": names + ev, "metadata": {
        "format": "partui-trace/1", "plan": {"pp": 2, "schedule": "1f1b", "microbatches": 2},
        "coords": {"0": "pp0", "1": "pp1"}}}))
    return load(str(path))


def test_step_timing_is_measured_from_the_trace(tmp_path):
    df = trace(tmp_path)
    t = step_timings(df, windows_of(df, by_step=True))[0]
    assert t.compute == {(0, "F", 0, 0): 10, (0, "F", 0, 1): 10, (0, "BW", 0, 0): 20, (0, "BW", 0, 1): 20,
                         (1, "F", 0, 0): 8, (1, "F", 0, 1): 8, (1, "BW", 0, 0): 16, (1, "BW", 0, 1): 16}
    # rank 0's window [0, 97] has 3 us on no span over 4 actions; rank 1's [3, 73] 4 us
    assert t.dispatch == {0: pytest.approx(0.75), 1: pytest.approx(1.0)}
    # each post by its place among the rank's posts of that side (its action list's order), the mean beside
    assert t.post == {(0, "SEND"): 3, (0, "RECV"): 1, (1, "SEND"): 2, (1, "RECV"): 1,
                      (0, "SEND", 0): 3, (0, "SEND", 1): 3, (0, "RECV", 0): 1, (0, "RECV", 1): 1,
                      (1, "SEND", 0): 2, (1, "SEND", 1): 2, (1, "RECV", 0): 1, (1, "RECV", 1): 1}
    # each measured transfer by its place among the recvs from that peer; rank 1's second recv found its
    # bytes there (no wait): the edge's mean stands for it
    assert t.latency == {(0, 1): 6, (1, 0): 6, (0, 1, 0): 6, (1, 0, 0): 6, (1, 0, 1): 6}


def test_sim_bubble_replays_the_trace_and_keeps_the_ideal_beside_it(tmp_path):
    r = overlap(trace(tmp_path), "rank")
    # measured: rank 0 computes 60 of [0, 97]; rank 1 48 of [3, 73]
    assert r["pipe_bubble_pct"].tolist() == pytest.approx([100 * (1 - 60 / 97), 100 * (1 - 48 / 70)])
    # simulated under that timing: rank 0 F0 [0.75, 10.75], send post to 13.75, F1 [14.5, 24.5], posts to
    # 28.5, BW0 reached 29.25, waits rank 1's send (41.75 + 6): [47.75, 67.75], BW1 [76.75, 96.75] -> 60 of 96;
    # rank 1 reaches F0 at 2, data 10.75 + 6: [16.75, 24.75], BW0 [25.75, 41.75], F1 [45.75, 53.75],
    # BW1 [54.75, 70.75] and its send's post to 72.75 -> 48 of 70.75
    assert r["sim_bubble_pct"].tolist() == pytest.approx([100 * (1 - 60 / 96), 100 * (1 - 48 / 70.75)])
    # the ideal: mean F 9, BW 18 everywhere, comm free: rank 0 idles B on 4 (F + B) + (F + B)
    assert r["sim_ideal_bubble_pct"].tolist() == pytest.approx([100 * 27 / 81, 0.0])


def test_merge_times_a_transfer_only_where_the_receiver_already_waited():
    def ev(pid, name, cat, ts, dur, **args):
        return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": 1, "ts": ts, "dur": dur, "args": args}
    r0 = {"rank": 0, "t0_us": 0, "t1_us": 100, "events": [
        ev(0, "send", "comm", 10, 50, op="send", peer=1, op_id=1), ev(0, "post send", "post", 10, 3, op_id=1),
        ev(0, "send", "comm", 40, 50, op="send", peer=1, op_id=2), ev(0, "post send", "post", 40, 3, op_id=2)]}
    r1 = {"rank": 1, "t0_us": 0, "t1_us": 100, "events": [
        # waiting since 5, before the first post returned at 13: the bytes landed at 16
        ev(1, "recv", "comm", 2, 14, op="recv", peer=0, op_id=7), ev(1, "wait recv", "wait", 5, 11, op_id=7),
        # looked only at 60, long after the second post: its completion is when the rank looked
        ev(1, "recv", "comm", 30, 30, op="recv", peer=0, op_id=8), ev(1, "wait recv", "wait", 60, 0.1, op_id=8)]}
    doc = tracefile.build_doc([r0, r1])
    recvs = sorted((e for e in doc["traceEvents"] if e.get("name") == "recv"), key=lambda e: e["ts"])
    assert recvs[0]["args"]["transfer_us"] == pytest.approx(6.0)   # 16 - the send's post at 10
    assert "transfer_us" not in recvs[1]["args"]
