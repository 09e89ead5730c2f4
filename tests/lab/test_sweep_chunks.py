"""The sweep a run of keys at a time (and a key longer than a run, a piece of its time at a time): the
same figures bit for bit as one sweep of every interval, where the runs cut awkwardly (a key a fixed
cut would split, keys with no interval, one key longer than a chunk, intervals open across a piece's
cut, ties at it), both held to a plain interval loop written here; its memory bounded by the chunk,
not the input; and every frame of a report (synthetic partui and torch.profiler traces, DeepSeek's
real one) the same bits under a chunk of ~100 rows as under one sweep."""
import json
import os
import tracemalloc

import numpy as np
import pandas as pd
import pytest

from partui.analysis.table import boundary_sweep as sweep_module
from partui.analysis import hta_overlap, load, overlap_views
from partui.analysis.table.boundary_sweep import key_runs, sweep
from partui.analysis.gpu.comm_kernels import family_table
from partui.analysis.gpu.gpu_steps import gpu_step_sums
from partui.analysis.figures.streams import gpu_overlap, stream_busy
from partui.bench.analysis import synthetic_kineto, synthetic_trace


def by_hand(key, ts, end, cls, n_cls):
    """Per key, by elementary segments: between each pair of consecutive boundary times, which classes
    have an interval open over the whole segment (class 0 not while a class-2 wait is open)."""
    out = {}
    for k in sorted(set(key.tolist())):
        mine = [(a, b, c) for kk, a, b, c in zip(key.tolist(), ts.tolist(), end.tolist(), cls.tolist()) if kk == k]
        times = sorted({t for a, b, _ in mine for t in (a, b)})
        lengths, inter0, union = [0.0] * n_cls, [0.0] * n_cls, 0.0
        for lo, hi in zip(times, times[1:]):
            on = [any(c == j and a <= lo and hi <= b for a, b, c in mine) for j in range(n_cls)]
            if n_cls > 2 and on[2]:
                on[0] = False
            for j in range(n_cls):
                lengths[j] += (hi - lo) * on[j]
                inter0[j] += (hi - lo) * (on[j] and on[0])
            union += (hi - lo) * (on[0] or (n_cls > 1 and on[1]))
        out[k] = (lengths, inter0, union)
    return out


def assert_same_bits(a, b):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)


def assert_like_by_hand(got, key, ts, end, cls, n_cls):
    want = by_hand(key, ts, end, cls, n_cls)
    keys, lengths, inter0, union = got
    assert keys.tolist() == sorted(want)
    for i, k in enumerate(keys.tolist()):
        assert lengths[i].tolist() == pytest.approx(want[k][0], abs=1e-9)
        assert inter0[i].tolist() == pytest.approx(want[k][1], abs=1e-9)
        assert union[i] == pytest.approx(want[k][2], abs=1e-9)


# keys 7 (3 rows), 2 (5 rows: longer than a chunk of 4), 9 (2 rows), 4 (2 rows), none of 0, 1, 3, 5, 6, 8,
# listed out of key order; a fixed cut every 4 rows would split key 7 and key 4
KEY = np.array([7, 2, 9, 7, 2, 4, 2, 9, 2, 7, 2, 4])
TS = np.array([0.0, 0.0, 1.0, 2.0, 1.0, 3.0, 5.0, 2.0, 5.0, 9.0, 20.0, 3.0])
END = np.array([4.0, 30.0, 1.0, 6.0, 5.0, 8.0, 5.0, 7.5, 12.0, 9.5, 21.0, 4.0])
CLS = np.array([0, 1, 0, 2, 0, 1, 0, 1, 2, 0, 1, 0])


def test_the_runs_keep_each_key_whole_and_give_a_long_key_alone():
    runs = [(None if rows is None else KEY[rows].tolist(), k, count) for rows, k, count in key_runs(KEY, 4)]
    assert runs == [(None, 2, 5), ([4, 4], None, None), ([7, 7, 7], None, None), ([9, 9], None, None)]
    # a chunk of 5: key 2 just fits whole; 4 and 7 together fill the next run, so 9 starts its own
    runs = [(None if rows is None else sorted(set(KEY[rows].tolist())), k) for rows, k, _ in key_runs(KEY, 5)]
    assert runs == [([2], None), ([4, 7], None), ([9], None)]


@pytest.mark.parametrize("n_cls", [1, 2, 3])
@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5, 100])
def test_a_chunked_sweep_is_the_one_sweep_bit_for_bit(chunk, n_cls):
    cls = np.minimum(CLS, n_cls - 1)
    whole = sweep(KEY, TS, END, cls, n_cls, chunk_rows=len(KEY))
    assert_same_bits(sweep(KEY, TS, END, cls, n_cls, chunk_rows=chunk), whole)
    assert_like_by_hand(whole, KEY, TS, END, cls, n_cls)


def test_one_long_key_cut_in_time_carries_what_is_open_across_each_cut():
    # one key: a comm interval open over every piece, compute nested and touching, waits, zero-length
    # intervals and many ties (every time a multiple of 0.5), so the cuts fall on boundaries
    rng = np.random.default_rng(7)
    n = 400
    ts = rng.integers(0, 200, n) / 2.0
    end = ts + rng.integers(0, 12, n) / 2.0
    ts[0], end[0] = -1.0, 500.0
    cls = rng.integers(0, 3, n)
    cls[0] = 1
    key = np.full(n, 3)
    whole = sweep(key, ts, end, cls, 3, chunk_rows=n)
    for chunk in (1, 7, 50, 199):
        assert_same_bits(sweep(key, ts, end, cls, 3, chunk_rows=chunk), whole)
    assert_like_by_hand(whole, key, ts, end, cls, 3)


def test_random_keys_and_chunks_match_the_one_sweep_and_the_loop():
    rng = np.random.default_rng(11)
    for trial in range(40):
        n = int(rng.integers(1, 120))
        key = rng.choice(rng.integers(0, 40, 4), n)
        key[: n // 2] = key[0]                       # one key holds half the rows
        if trial % 4 == 0:
            key = key - 20                           # negative keys: counted by np.unique
        ts = rng.integers(0, 80, n) / 4.0
        end = ts + rng.integers(0, 40, n) / 4.0
        n_cls = int(rng.integers(1, 4))
        cls = rng.integers(0, n_cls, n)
        whole = sweep(key, ts, end, cls, n_cls, chunk_rows=n)
        for chunk in (1, 3, n // 3 + 1):
            assert_same_bits(sweep(key, ts, end, cls, n_cls, chunk_rows=chunk), whole)
        assert_like_by_hand(whole, key, ts, end, cls, n_cls)


def peak_bytes(n, chunk):
    rng = np.random.default_rng(1)
    key = np.sort(rng.integers(0, 50, n))
    key[: n // 3] = 0                                # one key longer than the chunk
    ts = np.cumsum(rng.uniform(0, 2, n))
    end, cls = ts + rng.uniform(0, 5, n), rng.integers(0, 2, n).astype(np.int8)
    tracemalloc.start()
    try:
        sweep(key, ts, end, cls, 2, chunk_rows=chunk)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_sweeps_memory_follows_the_chunk_not_the_input():
    chunk = 20_000
    small, big = peak_bytes(100_000, chunk), peak_bytes(800_000, chunk)
    # a few bytes a row for the run masks; the sweep's own ~100 bytes a row only over a chunk
    assert big - small < 12 * 700_000, (small, big)
    assert big < 12 * 800_000 + 400 * chunk, big


REAL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "real-traces")
DEEPSEEK = os.path.join(REAL, "deepseek-profile-data", "train.json.gz")


def every_figure(df) -> dict:
    """Each frame a report computes from one trace: overlap by rank, step and op (CPU traces: the
    pipeline windows, the simulator's inputs and core sharing too), and on GPU traces the GPU
    tables and HTA's figure."""
    out = dict(overlap_views(df, ("rank", "step", "op")))
    if (df["device"] == "gpu").any():
        sums = gpu_step_sums(df)
        out.update(sums=sums, gpu=gpu_overlap(df, sums), streams=stream_busy(df, sums),
                   families=family_table(df), hta=hta_overlap(df))
    return out


def assert_chunks_change_no_figure(df, monkeypatch, chunk, long_keys=True):
    calls = {"_sweep_rows": 0, "_sweep_long_key": 0}
    for fn in calls:
        def counted(*args, _real=getattr(sweep_module, fn), _name=fn):
            calls[_name] += 1
            return _real(*args)
        monkeypatch.setattr(sweep_module, fn, counted)
    whole = every_figure(df)
    before = dict(calls)
    monkeypatch.setattr(sweep_module, "CHUNK_ROWS", chunk)
    chunked = every_figure(df)
    # the chunks were taken: more sweeps (runs of keys, keys cut in time) than with one sweep each
    after = {fn: calls[fn] - before[fn] for fn in calls}
    assert after["_sweep_rows"] + after["_sweep_long_key"] > before["_sweep_rows"] + before["_sweep_long_key"]
    assert before["_sweep_long_key"] == 0 and (after["_sweep_long_key"] > 0) == long_keys
    assert whole.keys() == chunked.keys()
    for name, frame in whole.items():
        pd.testing.assert_frame_equal(chunked[name], frame, check_exact=True, obj=name)


def test_a_kineto_reports_figures_are_the_same_bits_under_a_tiny_chunk(tmp_path, monkeypatch):
    # 3 steps of ~1,300 kernels on two streams, one rank: HTA's single key and each stream run long
    path = tmp_path / "k.json"
    path.write_text(json.dumps(synthetic_kineto(4000)))
    assert_chunks_change_no_figure(load(str(path)), monkeypatch, 97)


def test_a_partui_reports_figures_are_the_same_bits_under_a_tiny_chunk(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(synthetic_trace(6000)))
    assert_chunks_change_no_figure(load(str(path)), monkeypatch, 101)


@pytest.mark.skipif(not os.path.exists(DEEPSEEK), reason="../shared/real-traces is absent")
def test_deepseeks_real_trace_reports_the_same_bits_under_a_tiny_chunk(monkeypatch):
    assert_chunks_change_no_figure(load(DEEPSEEK), monkeypatch, 113)
