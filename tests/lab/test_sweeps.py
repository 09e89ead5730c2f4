"""The analysis's array sweeps on hand-built inputs with known answers: clip_index against a
hand-written loop, the per-op view's classes where a comm slice records no op or no group, and the
table's (rank, ts) order against np.lexsort."""
import json

import numpy as np
import pandas as pd
import pytest

from partui.analysis import load, overlap
from partui.analysis.table.events import COLUMNS, finish, rank_time_order
from partui.analysis.table.sweep import clip_index


def clip_by_hand(rank, ts, end, windows):
    """The pieces by a plain loop: per rank of the windows (in their order), per interval, per window."""
    out = []
    for r in dict.fromkeys(windows["rank"]):
        for i in range(len(ts)):
            if rank[i] != r:
                continue
            for w in windows[windows["rank"] == r].itertuples():
                a, b = max(ts[i], w.w0), min(end[i], w.w1)
                if b > a:
                    out.append((i, w.wid, a, b))
    return out


def test_clip_index_cuts_each_interval_to_its_ranks_windows():
    windows = pd.DataFrame({"wid": [0, 1, 2, 3], "rank": [0, 0, 2, 2], "w0": [0.0, 10.0, 0.0, 50.0],
                            "w1": [10.0, 20.0, 40.0, 60.0]})
    # rank 2 listed first (the input need not be in rank order); rank 1 has no window; one interval
    # crosses rank 0's two windows, one lies between rank 2's, one is empty
    rank = np.array([2, 0, 1, 0, 2, 0])
    ts = np.array([30.0, 5.0, 0.0, 12.0, 45.0, 3.0])
    end = np.array([55.0, 15.0, 9.0, 30.0, 48.0, 3.0])
    rows, wid, a, b = clip_index(rank, ts, end, windows)
    assert list(zip(rows.tolist(), wid.tolist(), a.tolist(), b.tolist())) == clip_by_hand(rank, ts, end, windows)
    assert list(zip(rows.tolist(), wid.tolist())) == [(1, 0), (1, 1), (3, 1), (0, 2), (0, 3)]


def test_clip_index_matches_the_loop_on_random_intervals():
    rng = np.random.default_rng(3)
    windows = pd.DataFrame({"rank": np.repeat([0, 1, 3], 4), "w0": np.tile([0.0, 25.0, 50.0, 75.0], 3)})
    windows["w1"] = windows["w0"] + rng.uniform(5, 25, len(windows))
    windows["wid"] = np.arange(len(windows))
    rank = np.sort(rng.integers(0, 4, 300))
    ts = rng.uniform(0, 100, 300)
    end = ts + rng.uniform(0, 40, 300)
    rows, wid, a, b = clip_index(rank, ts, end, windows)
    assert list(zip(rows.tolist(), wid.tolist(), a.tolist(), b.tolist())) == clip_by_hand(rank, ts, end, windows)


def X(rank, name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": rank, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_by_op_names_a_comm_without_op_by_its_name_and_without_group_as_question_mark(tmp_path):
    names = [{"ph": "M", "name": "thread_name", "pid": r, "tid": t, "args": {"name": n}}
             for r in (0, 1) for t, n in ((1, "compute"), (2, "comm"))]
    ev = [X(r, "step", "step", 0, 100, step=0) for r in (0, 1)]
    ev += [X(0, "F", "F", 0, 40), X(1, "F", "F", 20, 40)]
    ev += [X(0, "recv", "comm", 30, 20, tid=2, op="recv", peer=1),        # no group: "?"
           X(1, "send", "comm", 10, 20, tid=2, op="send", group="pp"),
           X(1, "all_reduce", "comm", 50, 20, tid=2, group="dp"),          # no op: its name
           X(0, "all_reduce", "comm", 60, 10, tid=2, op="all_reduce", group="dp")]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": names + ev, "metadata": {"format": "partui-trace/1"}}))
    r = overlap(load(str(path)), "op").set_index(["op", "group"])
    # recv [30, 50] under rank 0's F [0, 40]: 10 of 20 us hidden; send [10, 30] under rank 1's F
    # [20, 60]: 10 of 20; all_reduce on rank 1 [50, 70] under F: 10 of 20, on rank 0 [60, 70]: none
    assert r.loc[("recv", "?"), ["ops", "comm_ms", "overlapped_ms"]].tolist() == pytest.approx([1, 0.020, 0.010])
    assert r.loc[("send", "pp"), ["ops", "comm_ms", "overlapped_ms"]].tolist() == pytest.approx([1, 0.020, 0.010])
    assert r.loc[("all_reduce", "dp"), ["ops", "comm_ms", "overlapped_ms", "exposed_comm_ms"]].tolist() == \
        pytest.approx([2, 0.030, 0.010, 0.020])
    assert len(r) == 3


def test_rank_time_order_is_lexsorts_stable_order_and_none_when_sorted():
    rng = np.random.default_rng(5)
    rank = rng.integers(0, 4, 2000)
    ts = rng.integers(0, 30, 2000).astype(float)   # many ties: file order must hold among them
    order = rank_time_order(rank, ts)
    assert np.array_equal(order, np.lexsort((ts, rank)))
    assert rank_time_order(rank[order], ts[order]) is None


def test_finish_consuming_its_table_gives_the_same_table():
    rng = np.random.default_rng(6)
    n = 500
    df = pd.DataFrame({c: rng.uniform(0, 9, n) for c in COLUMNS})
    for c in ("name", "cat", "op", "group", "track", "kind", "device"):
        df[c] = pd.Categorical(rng.choice(["a", "b", "c"], n))
    df["rank"] = rng.integers(0, 3, n)
    df["ts"] = rng.integers(0, 20, n).astype(float)
    kept = finish(df.copy())
    assert kept["rank"].is_monotonic_increasing
    pd.testing.assert_frame_equal(finish(df.copy(), consume=True), kept)


def test_clip_index_when_every_interval_lies_in_one_window():
    windows = pd.DataFrame({"wid": [0, 1, 2], "rank": [0, 0, 1], "w0": [0.0, 10.0, 0.0], "w1": [10.0, 20.0, 9.0]})
    rank, ts, end = np.array([0, 0, 1, 1]), np.array([1.0, 12.0, 2.0, 4.0]), np.array([9.0, 25.0, 3.0, 4.0])
    rows, wid, a, b = clip_index(rank, ts, end, windows)
    # the last interval is empty: no piece; the second is cut at its window's end
    assert list(zip(rows.tolist(), wid.tolist(), a.tolist(), b.tolist())) == \
        [(0, 0, 1.0, 9.0), (1, 1, 12.0, 20.0), (2, 2, 2.0, 3.0)] == clip_by_hand(rank, ts, end, windows)


def test_sweep_of_no_intervals_is_empty_and_of_one_is_its_length():
    from partui.analysis.table.sweep import sweep
    none = np.zeros(0)
    keys, lengths, inter0, union = sweep(np.zeros(0, np.int64), none, none, np.zeros(0, np.int64), 2)
    assert len(keys) == 0 and lengths.shape == (0, 2) and inter0.shape == (0, 2) and len(union) == 0
    keys, lengths, inter0, union = sweep(np.array([4]), np.array([1.0]), np.array([3.5]), np.array([1]), 2)
    assert keys.tolist() == [4] and lengths.tolist() == [[0.0, 2.5]] and inter0.tolist() == [[0.0, 0.0]]
    assert union.tolist() == [2.5]
