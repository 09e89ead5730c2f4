"""stream_events, the arrays view of a streamed trace (partui.analysis.reading.streamed): the complete events'
columns in file order, equal to the dict reader's columns of the whole document (event_columns.
slice_columns, an independent path) and to Columns.frame()'s, whatever the decoder (pyarrow or dicts),
layout (compact, pretty-printed, gzip'd), text pids, missing names or times, or false cuts; and a
read that never imports pandas."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from partui.analysis.reading import columns, json_stream
from partui.analysis.table.event_columns import ARG_KEYS, TEXT_ARGS, slice_columns, thread_names
from partui.analysis.reading.streamed import read_streamed, stream_events
from partui.bench.analysis import synthetic_kineto

TEXT = ("name", "cat") + TEXT_ARGS
NUMBERS = ("ts", "dur") + tuple(k for k in ARG_KEYS if k not in TEXT_ARGS)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARROW = [True, False] if columns.arrow_reader() is not None else [False]


def write(path, doc, indent=None) -> str:
    text = json.dumps(doc, indent=indent).encode()
    with (gzip.open if str(path).endswith(".gz") else open)(path, "wb") as f:
        f.write(text)
    return str(path)


def names_of(codes: np.ndarray, names: list) -> list:
    return [names[c] if c >= 0 else None for c in codes.tolist()]


def assert_same_numbers(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float64 and len(got) == len(want)
    assert np.array_equal(got, want, equal_nan=True)


def assert_as_whole_read(path: str, arrow: bool) -> None:
    """Every column of stream_events equals the dict reader's of the file decoded whole."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        doc = json.load(f)
    want = slice_columns(doc["traceEvents"])
    got = stream_events(path, use_arrow=arrow)
    assert got.events == len(doc["traceEvents"]) and got.rows == len(want["ts"])
    assert got.batches["arrow"] > 10 if arrow else got.batches["arrow"] == 0  # it streamed, through that decoder
    assert got.threads == thread_names(doc["traceEvents"])
    assert got.head == {k: v for k, v in doc.items() if k != "traceEvents"}
    for key in TEXT:
        codes, names = got.text(key)
        assert codes.dtype == np.int32
        assert len(set(names)) == len(names) and set(codes.tolist()) <= set(range(-1, len(names)))
        assert names_of(codes, names) == [None if v is None else v for v in want[key].tolist()], key
    for key in NUMBERS:
        assert_same_numbers(got.numbers(key), want[key])
    for key in ("pid", "tid"):
        ids = got.ids(key)
        assert ids.dtype == want[key].dtype and ids.tolist() == want[key].tolist(), key


def odd_kineto(n: int) -> dict:
    """A torch.profiler-like trace with what the fast path must step around: text pids, a name and a
    time missing, a name holding a false cut, a nested list, op/group args."""
    doc = synthetic_kineto(n)
    evs = doc["traceEvents"]
    evs.insert(n // 2, {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                        "tid": "PyTorch Profiler", "ts": 1.0, "dur": 5e3, "args": {"Op count": 0}})
    xs = [e for e in evs if e["ph"] == "X"]
    del xs[3]["name"]               # a missing name: code -1
    del xs[5]["ts"]                 # a missing time: kept here (the frame drops it)
    del xs[6]["dur"]
    xs[7]["name"] = "odd},{name"    # a gap inside a string: a false cut
    xs[8]["args"]["nested"] = [{"a": 1}, {"b": 2}]
    xs[9]["args"].update(op="fwd", group="tp")
    xs[10]["args"]["op"] = "bwd"
    return doc


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(json_stream, "BLOCK", 4096)  # dozens of batches from a small trace


@pytest.mark.parametrize("arrow", ARROW)
@pytest.mark.parametrize("name,indent", [("compact.json", None), ("pretty.json", 2), ("pretty.json.gz", 1),
                                         ("compact.json.gz", None)])
def test_the_arrays_are_the_whole_documents_columns(tmp_path, small_blocks, arrow, name, indent):
    assert_as_whole_read(write(tmp_path / name, odd_kineto(600), indent), arrow)


@pytest.mark.parametrize("arrow", ARROW)
def test_a_hand_built_trace_reads_as_written(tmp_path, arrow):
    evs = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}},
           {"ph": "X", "name": "b", "cat": "k", "pid": 1, "tid": 2, "ts": 10, "dur": 3, "args": {"correlation": 7}},
           {"ph": "i", "name": "mark", "pid": 1, "tid": 2, "ts": 11},
           {"ph": "X", "name": "a", "pid": 1, "tid": 3, "ts": 12.5},
           {"ph": "X", "name": "b", "cat": "k", "pid": 1, "tid": 2, "ts": 20, "dur": 1}]
    path = write(tmp_path / "t.json", {"schemaVersion": 1, "traceEvents": evs, "after": [1]})
    got = stream_events(path, use_arrow=arrow)
    assert (got.events, got.rows, got.threads, got.head) == (5, 3, {(1, 2): "main"}, {"schemaVersion": 1, "after": [1]})
    codes, names = got.text("name")
    assert codes.tolist() == [0, 1, 0] and names == ["b", "a"]  # numbered in the order first met
    codes, names = got.text("cat")
    assert codes.tolist() == [0, -1, 0] and names == ["k"]
    assert_same_numbers(got.numbers("ts"), np.array([10, 12.5, 20]))
    assert_same_numbers(got.numbers("dur"), np.array([3, np.nan, 1]))
    assert_same_numbers(got.numbers("correlation"), np.array([7, np.nan, np.nan]))
    assert_same_numbers(got.numbers("bytes"), np.full(3, np.nan))
    assert got.ids("tid").tolist() == [2, 3, 2] and got.ids("pid").dtype == np.int64
    with pytest.raises(KeyError, match="already taken"):
        got.numbers("ts")  # each column joined once
    with pytest.raises(KeyError, match="not a number column"):
        got.numbers("name")


@pytest.mark.parametrize("arrow", ARROW)
def test_the_arrays_are_the_frames_columns(tmp_path, small_blocks, arrow):
    doc = synthetic_kineto(500)
    doc["traceEvents"].insert(300, {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                                    "tid": "PyTorch Profiler", "ts": 1.0, "dur": 5e3})
    path = write(tmp_path / "t.json", doc, indent=1)
    frame = read_streamed(path, use_arrow=arrow)[1].frame()
    got = stream_events(path, use_arrow=arrow)
    for key in TEXT:
        assert names_of(*got.text(key)) == [None if isinstance(v, float) else v for v in frame[key].tolist()], key
    for key in NUMBERS:
        want = frame[key].to_numpy()
        assert_same_numbers(np.nan_to_num(got.numbers(key), nan=0.0) if key == "dur" else got.numbers(key), want)
    for key in ("pid", "tid"):
        assert got.ids(key).tolist() == frame[key].tolist()


def test_not_a_streamable_file_is_none(tmp_path):
    assert stream_events(write(tmp_path / "list.json", [{"ph": "X"}])) is None
    path = tmp_path / "broken.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X"}, {"ph": ')
    assert stream_events(str(path)) is None


def test_a_streamed_read_never_imports_pandas(tmp_path):
    path = write(tmp_path / "t.json.gz", odd_kineto(400), indent=1)
    code = ("import sys; from partui.analysis.reading.streamed import stream_events; got = stream_events(sys.argv[1]); "
            "got.text('name'); got.numbers('ts'); got.ids('pid'); "
            "print(got.rows, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["804", "False"]  # 400 kernels, 400 launches, 3 steps, the Spans row


def test_first_met_is_the_order_codes_are_first_met():
    from partui.analysis.reading.column_parts import first_met
    rng = np.random.default_rng(3)
    for high in (1, 5, 300, 40_000):  # int16 radix and int32 sorts both
        codes = rng.integers(-1, high, 5000).astype(np.int32)
        want = list(dict.fromkeys(c for c in codes.tolist() if c >= 0))  # plain Python: first seen first
        assert first_met(codes).tolist() == want
    assert first_met(np.array([2, -1, 0, 2, 1], np.int32)).tolist() == [2, 0, 1]
    assert first_met(np.zeros(0, np.int32)).tolist() == []


def test_decoded_names_are_coded_first_met_with_missing_minus_one():
    from partui.analysis.reading.column_parts import Names
    names = Names()
    values = np.array([None, "b", "", "a", "b", float("nan"), None, "a"], dtype=object)
    assert names.values_part(values).tolist() == [-1, 0, 1, 2, 0, -1, -1, 2]  # "" is a name, NaN is not
    assert list(names.seen) == ["b", "", "a"]
    assert names.values_part(np.array(["a", "c"], dtype=object)).tolist() == [2, 3]  # numbered on
    assert names.values_part(np.full(4, None, dtype=object)) is None


@pytest.mark.skipif(columns.arrow_reader() is None, reason="pyarrow is not installed")
def test_arrow_columns_read_from_their_buffers_are_pyarrows_own_numpy():
    import pyarrow as pa

    from partui.analysis.reading.column_parts import numpy_of
    rng = np.random.default_rng(5)
    values = rng.random(1000)
    nulls = rng.random(1000) < 0.3
    floats = pa.chunked_array([pa.array(values[:400], mask=nulls[:400]), pa.array(values[400:])]).slice(3, 990)
    ints = pa.array(rng.integers(-5, 5, 1000)).slice(11, 500)  # offsets off a byte's bits
    flags = pa.chunked_array([pa.array(rng.random(1000) < 0.5).slice(5, 600), pa.array([True, False, True])])
    for col, dtype in ((floats, np.float64), (ints, np.int64), (flags, bool)):
        want = col.to_numpy() if isinstance(col, pa.ChunkedArray) else col.to_numpy(zero_copy_only=False)
        got = numpy_of(col, dtype)
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=dtype is np.float64)
    assert numpy_of(pa.chunked_array([], pa.float64()), np.float64).tolist() == []


@pytest.mark.parametrize("arrow", ARROW)
def test_a_few_columns_read_as_every_column_reads_them(tmp_path, small_blocks, arrow):
    """fields=("correlation",) (what the lean reports keep): arrow types only that arg, so an odd value in
    another (a text step, a list as bytes) no longer sends its batch to the dict reader; the columns kept
    are the full read's, value for value, and a frame is refused (it needs every column)."""
    doc = odd_kineto(600)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    for e in xs[20::50]:
        e["args"]["step"] = "not a number"     # the full schema's float refuses its batch
        e["args"]["bytes"] = [1, 2]
    path = write(tmp_path / "odd.json", doc)
    full, few = stream_events(path, use_arrow=arrow), stream_events(path, use_arrow=arrow, fields=("correlation",))
    for key in ("name", "cat"):
        assert names_of(*few.text(key)) == names_of(*full.text(key))
    for key in ("ts", "dur", "correlation"):
        assert_same_numbers(few.numbers(key), full.numbers(key))
    for key in ("pid", "tid"):
        assert few.ids(key).tolist() == full.ids(key).tolist()
    assert few.threads == full.threads and few.events == full.events
    with pytest.raises(KeyError, match="not a column of the streamed events"):
        few.numbers("step")
    if arrow:
        assert few.batches["dicts"] < full.batches["dicts"]
    _, cols = read_streamed(path, use_arrow=arrow, fields=("correlation",))
    with pytest.raises(ValueError, match="a frame needs every column"):
        cols.frame()


def test_the_last_cut_is_the_last_gap_a_regex_finds():
    """json_stream.last_cut tries the last `}`s one by one, then falls back to a regex search: both give
    the start of the last `},{` gap (or None), here against a plain left-to-right regex scan, on events
    with few and with many `}` (past LAST_TRIES), gaps in strings, and text with no gap at all."""
    import random
    rng = random.Random(5)
    pieces = [b'{"a":1}', b'{"args":{"x":{"y":{}}}}', b"}" * 100, b'{"name":"a},{b"}', b" , ", b",\n  ", b"{}", b"x"]
    for _ in range(400):
        buf = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        want = None
        for m in json_stream.BETWEEN.finditer(buf):
            want = m.start()
        assert json_stream.last_cut(buf) == want, buf
