"""The streaming reader's memory and work, each pinned on a hand-built trace against the whole-document
read (reader.frame of read_doc, the oracle): batches copied out of arrow (nothing of arrow's pool held
between batches), text kept as codes in the order names are met and sorted at the join as events.labels
sorts them, text-pid events found before arrow refuses a batch once a trace has shown them, and an
error keeping a batch falls back to the whole read."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from partui.analysis.reading import column_parts, columns, json_stream, reader
from partui.analysis.table.events import labels, slices

pa = pytest.importorskip("pyarrow")


def whole(path: str) -> pd.DataFrame:
    return reader.frame(reader.read_doc(path), path)


def same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    for col in got.columns:
        if isinstance(got[col].dtype, pd.CategoricalDtype):
            assert list(got[col].cat.categories) == list(want[col].cat.categories), col
            assert got[col].cat.codes.dtype == want[col].cat.codes.dtype, col


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(json_stream, "BLOCK", 4096)
    monkeypatch.setattr(reader, "STREAM_MIN", 0)


def kineto(n: int, text_pid_every: int = 0) -> dict:
    """n kernels and their launches on a rank; every text_pid_every-th a torch.profiler "Spans" row."""
    events = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
              {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "only a label"}}]
    for i in range(n):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": 10.0 * i, "dur": 2.0, "args": {"correlation": i}})
        events.append({"ph": "X", "cat": "kernel", "name": f"gemm_{i % 5}" if i % 3 else "nccl_AllReduce",
                       "pid": 0, "tid": 7, "ts": 10.0 * i + 3, "dur": 4.0, "args": {"correlation": i, "stream": 7}})
        if text_pid_every and i % text_pid_every == 0:
            events.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                           "tid": "PyTorch Profiler", "ts": 10.0 * i, "dur": 1.0})
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}


def write(tmp_path, doc, indent=None) -> str:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc, indent=indent))
    return str(path)


def test_every_kept_part_is_numpys_own_and_arrows_pool_is_empty_between_batches(tmp_path, small_blocks):
    path = write(tmp_path, kineto(400))
    before = pa.total_allocated_bytes()
    head, cols = reader.read_streamed(path)
    assert cols.batches["arrow"] > 5
    held = [p for parts in cols.chunks.values() for p in parts if isinstance(p, np.ndarray)]
    assert held and all(column_parts.owned(p) is p for p in held)  # no view of an arrow buffer kept
    assert pa.total_allocated_bytes() - before < 64 << 10  # every batch's tables gone (was: all of them)
    same(reader.read_table(path), whole(path))


def test_names_met_in_any_order_are_the_whole_reads_categories_and_codes(tmp_path, small_blocks):
    doc = kineto(300)
    for i, e in enumerate(doc["traceEvents"]):  # a name met late, names a thread label only, none at all
        if e["ph"] == "X" and i > 500 and i % 4 == 0:
            e["name"] = "aaa first when sorted, met last"
        if e["ph"] == "X" and i % 9 == 0:
            del e["cat"]
    path = write(tmp_path, doc)
    got = reader.read_table(path)
    same(got, whole(path))
    assert "only a label" not in list(got["name"].cat.categories)  # an M event's own name is no slice's


def test_a_number_among_names_in_a_dict_batch_keeps_the_whole_reads_order_of_first_meeting(tmp_path, small_blocks):
    doc = kineto(300)
    doc["traceEvents"][400]["name"] = 12345  # arrow refuses that batch; the dicts bring a number
    path = write(tmp_path, doc)
    head, cols = reader.read_streamed(path)
    assert cols.batches["dicts"] >= 2 and cols.batches["arrow"] > 5
    got = reader.read_table(path)
    same(got, whole(path))
    assert 12345 in list(got["name"].cat.categories)  # text and a number: unsorted, in order met


@pytest.mark.parametrize("n", [3, 200])  # int8 codes, and int16 past 127 names
def test_joined_codes_are_labels_of_all_values_in_the_dtype_pandas_gives(n):
    names = column_parts.Names()
    rng = np.random.default_rng(0)
    values = np.array([f"k{i}" for i in rng.integers(0, n, 5000)] + [None] * 7, dtype=object)
    rng.shuffle(values)
    parts = [names.values_part(values[:2000]), 13, names.values_part(values[2000:])]
    got = names.categorical(parts)
    want = labels(np.concatenate([values[:2000], [None] * 13, values[2000:]]))
    assert list(got.categories) == list(want.categories) and got.codes.dtype == want.codes.dtype
    np.testing.assert_array_equal(got.codes, want.codes)
    assert parts == []  # consumed: each part freed once copied


def test_text_pids_in_every_batch_cost_one_refused_read_not_one_a_batch(tmp_path, monkeypatch):
    monkeypatch.setattr(json_stream, "BLOCK", 1 << 14)
    monkeypatch.setattr(reader, "STREAM_MIN", 0)
    path = write(tmp_path, kineto(1500, text_pid_every=40), indent=1)
    refused = []
    read = columns.Columns._read_lines
    monkeypatch.setattr(columns.Columns, "_read_lines",
                        lambda self, lines: (lambda t: t if t is not None else refused.append(len(lines)))(read(self, lines)))
    head, cols = reader.read_streamed(path)
    assert cols.batches["arrow"] > 20 and cols.text_ids
    assert len(refused) == 1  # the first batch that held one; later ones are split around them first
    got = reader.read_table(path)
    same(got, whole(path))
    assert (got["tid"] == "PyTorch Profiler").sum() == len(range(0, 1500, 40))


def test_written_text_ids_finds_torch_profilers_forms_and_not_other_ids():
    lines = b'{"pid":"Spans","tid":"x"}\n{"pid": 3, "External id":"e"}\n{"tid": "PyTorch Profiler"}'
    assert columns.written_text_ids(lines) == [1, lines.index(b'"tid":"'), lines.index(b'"tid": "')]
    assert columns.written_text_ids(b'{"pid" :  "odd spacing"}') == []  # the exact regex path reads it


def test_a_text_pid_written_an_odd_way_after_the_first_still_reads_as_the_whole_read(tmp_path, monkeypatch):
    monkeypatch.setattr(json_stream, "BLOCK", 1 << 14)
    monkeypatch.setattr(reader, "STREAM_MIN", 0)
    raw = json.dumps(kineto(900, text_pid_every=60), indent=1).encode()
    at = raw.rfind(b'"pid": "Spans"')
    (tmp_path / "rank0.json").write_bytes(raw[:at] + b'"pid"  :   "Spans"' + raw[at + len(b'"pid": "Spans"'):])
    path = str(tmp_path / "rank0.json")
    same(reader.read_table(path), whole(path))


def test_an_error_keeping_a_batch_falls_back_to_the_whole_read(tmp_path, small_blocks, monkeypatch):
    path = write(tmp_path, kineto(300))
    add = columns.Columns._add_table
    kept = []

    def third_fails(self, table):
        kept.append(table.num_rows)
        if len(kept) == 3:
            raise TypeError("a column that is not what the schema says")
        add(self, table)

    monkeypatch.setattr(columns.Columns, "_add_table", third_fails)
    assert reader.read_streamed(path) is None  # the reader gives up streaming, not the load
    monkeypatch.setattr(columns.Columns, "_add_table", add)
    same(reader.load(path), whole(path))


@pytest.mark.parametrize("trim_rows, calls", [(0, len(columns.FIELDS)), (1 << 40, 0)])
def test_a_big_join_gives_memory_back_between_columns_a_small_one_does_not(tmp_path, small_blocks, monkeypatch,
                                                                           trim_rows, calls):
    path = write(tmp_path, kineto(200))
    head, cols = reader.read_streamed(path)
    released = []
    monkeypatch.setattr(columns, "TRIM_ROWS", trim_rows)
    monkeypatch.setattr(columns, "release_freed_memory", lambda: released.append(1))
    got = cols.frame()
    assert len(released) == calls
    same(got, slices(reader.read_doc(path)["traceEvents"]))  # the whole document's slices table
    assert len(got) == sum(1 for e in kineto(200)["traceEvents"] if e["ph"] == "X")
