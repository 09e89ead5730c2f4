"""The streaming reader (json_stream, columns) against the whole-document reader on the same file:
the same table, dtypes and category order, whatever the batch size, the decoder (pyarrow or
dicts), the layout (compact or pretty-printed, gzip'd) or false cuts inside strings and nested
lists; the same errors for broken files. And the parquet cache beside a trace: read again from it,
never trusted over a changed trace, and the progress line: on a terminal only."""
from __future__ import annotations

import gzip
import io
import json
import os

import pandas as pd
import pytest

from partui.analysis.reading import columns, json_stream, progress, reader, trace_cache
from partui.analysis.table.events import TraceError, is_missing
from partui.bench.analysis import synthetic_kineto, synthetic_trace


def whole(path: str) -> pd.DataFrame:
    """The oracle: the file decoded whole, as the reader did before it streamed."""
    return reader.frame(reader.read_doc(path), path)


def same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    for col in got.columns:
        if isinstance(got[col].dtype, pd.CategoricalDtype):  # the same codes mean the same names
            assert list(got[col].cat.categories) == list(want[col].cat.categories), col
    assert got.attrs == want.attrs


def streamed(path: str) -> tuple[pd.DataFrame, dict]:
    head, cols = reader.read_streamed(path)
    return reader.read_table(path), cols.batches


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(json_stream, "BLOCK", 4096)  # dozens of batches from a small trace
    monkeypatch.setattr(reader, "STREAM_MIN", 0)  # streamed, however small


def write(path, doc, indent=None):
    text = json.dumps(doc, indent=indent).encode()
    with (gzip.open if str(path).endswith(".gz") else open)(path, "wb") as f:
        f.write(text)
    return str(path)


@pytest.mark.parametrize("arrow", [True, False])
def test_a_partui_trace_read_in_many_batches_is_the_whole_read(tmp_path, small_blocks, monkeypatch, arrow):
    if not arrow:
        monkeypatch.setattr(reader, "arrow_reader", lambda *fields: None)
        monkeypatch.setattr(columns, "arrow_reader", lambda *fields: None)
        monkeypatch.setattr(reader, "WHOLE_WITHOUT_ARROW", 0)  # stream even a small file
    elif columns.arrow_reader() is None:
        pytest.skip("pyarrow is not installed")
    path = write(tmp_path / "t.json", synthetic_trace(3000, ranks=2))
    got, batches = streamed(path)
    assert batches["arrow" if arrow else "dicts"] > 20  # it did stream, through that decoder
    same(got, whole(path))
    assert len(got) == sum(1 for e in json.load(open(path))["traceEvents"] if e["ph"] == "X")


def test_without_pyarrow_a_file_under_the_bound_is_decoded_whole(tmp_path, small_blocks, monkeypatch):
    monkeypatch.setattr(reader, "arrow_reader", lambda: None)
    path = write(tmp_path / "t.json", synthetic_trace(600, ranks=1))
    monkeypatch.setattr(reader, "read_streamed", lambda *a: pytest.fail("streamed"))
    same(reader.read_table(path), whole(path))


def test_a_pretty_printed_gzipped_kineto_trace_with_text_pids_is_the_whole_read(tmp_path, small_blocks):
    doc = synthetic_kineto(800)
    doc["traceEvents"].insert(500, {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                                    "tid": "PyTorch Profiler", "ts": 1.0, "dur": 5e3, "args": {"Op count": 0}})
    doc["traceName"] = "after the events"  # a key after the array: read from the tail
    path = write(tmp_path / "rank0.json.gz", doc, indent=2)
    got, batches = streamed(path)
    assert batches["dicts"] >= 1 and batches["arrow"] >= 1  # the text pid's batch alone took the dict path
    same(got, whole(path))
    assert got["tid"].dtype == object  # ids stay as read: ints and text


def test_a_refused_batch_sends_only_its_text_pid_events_to_dicts(tmp_path, monkeypatch):
    if columns.arrow_reader() is None:
        pytest.skip("pyarrow is not installed")
    monkeypatch.setattr(json_stream, "BLOCK", 1 << 16)
    monkeypatch.setattr(reader, "STREAM_MIN", 0)
    monkeypatch.setattr(columns, "SPLIT_MIN", 2048)
    doc = synthetic_kineto(1500)
    for at, pid in ((700, "Spans"), (702, "Traces")):  # two close by: one batch, two runs of arrow around them
        doc["traceEvents"].insert(at, {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": pid,
                                       "tid": "PyTorch Profiler", "ts": 1.0, "dur": 5e3})
    path = write(tmp_path / "rank0.json", doc, indent=1)
    decoded = []
    keep = columns.Columns.add_events
    monkeypatch.setattr(columns.Columns, "add_events", lambda self, events: (decoded.append(events), keep(self, events))[1])
    head, cols = reader.read_streamed(path)
    text_pid = [[e["pid"] for e in events] for events in decoded if any(isinstance(e["pid"], str) for e in events)]
    assert text_pid == [["Spans"], ["Traces"]]  # each alone: every other event of its batch read by arrow
    assert cols.batches["arrow"] > 10 and cols.batches["dicts"] == 3  # the two, and the events after the last cut
    same(reader.read_table(path), whole(path))


def test_false_cuts_inside_strings_and_nested_lists_cost_time_not_events(tmp_path, small_blocks):
    doc = synthetic_trace(400, ranks=1)
    for i, e in enumerate(doc["traceEvents"]):
        if e["ph"] == "X" and i % 7 == 0:
            e["args"]["nested"] = [{"a": 1}, {"b": "},{"}]  # a gap inside a list and inside a string
            e["name"] = e["cat"] = "odd},{name"
    path = write(tmp_path / "t.json", doc)
    got, _ = streamed(path)
    same(got, whole(path))
    assert (got["name"] == "odd},{name").sum() == sum(1 for i, e in enumerate(doc["traceEvents"])
                                                      if e["ph"] == "X" and i % 7 == 0)


def test_event_lines_flatten_json_line_breaks_and_name_the_batchs_own_gap():
    text = b'{"name": "a\\nb",\r\n  "ts": 1\n  },\n  {"name": "c"}'   # an escaped \\n stays as written
    flat, gap = columns.event_lines(text)
    assert flat == b'{"name": "a\\nb",  "ts": 1  },  {"name": "c"}' and gap == b"},  {"
    assert json.loads(b"[" + flat + b"]") == json.loads(b"[" + text + b"]")
    assert columns.event_lines(b'{"a": 1},{"a": 2}')[1] == b"},{"


def test_gaps_of_several_forms_and_a_gap_inside_a_string_read_through_arrow_as_the_whole_read(tmp_path, small_blocks):
    if columns.arrow_reader() is None:
        pytest.skip("pyarrow is not installed")
    doc = synthetic_kineto(600)
    for i, e in enumerate(doc["traceEvents"]):
        if e["ph"] == "X" and i % 11 == 0:
            e["name"] = "odd},\n  {name"  # the pretty-printed gap, as text inside a name
    raw = json.dumps(doc, indent=2).encode()
    raw = raw.replace(b"},\n    {", b"} ,{", 40)  # the first 40 gaps written another way
    path = tmp_path / "rank0.json"
    path.write_bytes(raw)
    got, batches = streamed(str(path))
    same(got, whole(str(path)))
    assert batches["arrow"] > 10  # the mixed gaps did not send batches to the dict decoder
    assert (got["name"] == "odd},\n  {name").sum() == sum(1 for i, e in enumerate(doc["traceEvents"])
                                                           if e["ph"] == "X" and i % 11 == 0)


@pytest.mark.parametrize("damage, words", [
    (lambda raw: raw[: len(raw) * 2 // 3], "not valid JSON"),
    (lambda raw: raw.replace(b'{"ph":"X"', b'7,{"ph":"X"', 1), "not a JSON object"),
    (lambda raw: b'{"metadata": {"format": "partui-trace/1"}, "traceEvents": []}', "holds no events"),
])
def test_a_broken_file_gets_the_whole_readers_error(tmp_path, small_blocks, damage, words):
    good = write(tmp_path / "good.json", synthetic_trace(400, ranks=1)).encode()
    path = tmp_path / "bad.json"
    path.write_bytes(damage(open(good, "rb").read().replace(b" ", b"")))
    with pytest.raises(TraceError, match=words) as got:
        reader.load(str(path))
    with pytest.raises(TraceError) as want:
        whole(str(path))
    assert str(got.value) == str(want.value)


def test_the_cache_is_read_again_and_never_trusted_over_a_changed_trace(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    monkeypatch.setattr(trace_cache, "MIN_BYTES", 0)
    monkeypatch.delenv("PARTUI_TRACE_CACHE", raising=False)
    path = write(tmp_path / "t.json", synthetic_trace(600, ranks=2))
    first = reader.load(path)
    assert os.path.isfile(trace_cache.cache_path(path))
    calls = []
    real = reader.read_table
    monkeypatch.setattr(reader, "read_table", lambda *a, **k: calls.append(a) or real(*a, **k))
    again = reader.load(path)
    assert calls == []  # from the cache
    same(again, first)
    same(again, whole(path))
    doc = synthetic_trace(600, ranks=2, seed=1)  # same size class, other times: a changed trace
    write(path, doc)
    os.utime(path, ns=(1, 1))
    changed = reader.load(path)
    assert len(calls) == 1
    same(changed, whole(path))
    reader.load(path, comm_kernels=["gemm"])  # other patterns: not this cache's
    assert len(calls) == 2
    with open(trace_cache.cache_path(path), "r+b") as f:  # a damaged cache is read past, rewritten
        f.write(b"garbage")
    same(reader.load(path), whole(path))
    assert len(calls) == 3 and reader.load(path) is not None and len(calls) == 3


def test_a_cache_keeps_unfilled_columns_shared_and_reads_a_column_at_a_time(tmp_path, monkeypatch):
    """A torch.profiler table's number columns no event fills are one shared NaN (events.missing): the
    cache names them instead of writing 7 columns of NaN, and a cache read shares them again; the frame
    equals the trace's own reading column for column."""
    pytest.importorskip("pyarrow")
    monkeypatch.setattr(trace_cache, "MIN_BYTES", 0)
    monkeypatch.delenv("PARTUI_TRACE_CACHE", raising=False)
    path = str(tmp_path / "k.json")
    with open(path, "w") as f:
        json.dump(synthetic_kineto(600), f)
    first = reader.load(path)
    shared = [c for c in first.columns if is_missing(first[c].to_numpy())]
    assert shared  # the test means something: a Kineto table has unfilled number columns
    import pyarrow.parquet as pq
    written = pq.ParquetFile(trace_cache.cache_path(path)).schema_arrow.names
    assert not set(shared) & set(written) and set(written) | set(shared) == set(first.columns)
    again = reader.load(path)
    assert list(again.columns) == list(first.columns)
    assert [c for c in again.columns if is_missing(again[c].to_numpy())] == shared
    assert first["op"].cat.categories.dtype == object   # kineto's op labels: object-typed, as read
    same(again, first)


def test_a_torch_profiler_trace_with_text_tids_is_cached_and_read_back_as_read(tmp_path, monkeypatch):
    """Kineto's "Spans" / "PyTorch Profiler" rows make the tid column objects, ints and text mixed, which
    parquet cannot hold: the cache writes it as codes and its values as JSON, and a cache read gives the
    same ints and text back (it wrote no cache at all for such a trace before)."""
    pytest.importorskip("pyarrow")
    monkeypatch.setattr(trace_cache, "MIN_BYTES", 0)
    monkeypatch.delenv("PARTUI_TRACE_CACHE", raising=False)
    doc = synthetic_kineto(600)
    doc["traceEvents"] += [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                            "tid": "PyTorch Profiler", "ts": 5.0, "dur": 9.0, "args": {}},
                           {"ph": "X", "cat": "Trace", "name": "no tid", "pid": 3, "ts": 6.0, "dur": 1.0}]
    path = write(tmp_path / "spans.json", doc)
    first = reader.load(path)
    assert first["tid"].dtype == object and {type(t) for t in first["tid"]} >= {int, str}
    assert os.path.isfile(trace_cache.cache_path(path))
    again = reader.load(path)
    assert again["tid"].tolist() == first["tid"].tolist()
    assert [type(t) for t in again["tid"]] == [type(t) for t in first["tid"]]
    same(again, first)


def test_a_small_file_is_decoded_whole(tmp_path, monkeypatch):
    path = write(tmp_path / "t.json", synthetic_trace(300, ranks=1))
    monkeypatch.setattr(reader, "read_streamed", lambda *a: pytest.fail("streamed"))
    same(reader.read_table(path), whole(path))


def test_no_cache_when_turned_off_or_for_small_traces(tmp_path, monkeypatch):
    path = write(tmp_path / "t.json", synthetic_trace(300, ranks=1))
    reader.load(path)  # under MIN_BYTES
    monkeypatch.setattr(trace_cache, "MIN_BYTES", 0)
    monkeypatch.setenv("PARTUI_TRACE_CACHE", "0")
    reader.load(path)
    assert os.listdir(tmp_path) == ["t.json"]


def test_progress_shows_on_a_terminal_after_the_delay_and_never_in_a_pipe(tmp_path, monkeypatch, capsys):
    out = io.StringIO()
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    shown = progress.Progress("reading t.json", enabled=True, stream=out)
    shown.show(progress.read_text(3 * 2**20, 10 * 2**20, 1234, gz=False))
    assert "reading t.json: 3 of 10 MB read, 1,234 events" in out.getvalue()
    shown.done()
    assert out.getvalue().endswith("\r\x1b[K")
    path = write(tmp_path / "t.json", synthetic_trace(300, ranks=1))
    reader.load(path, progress=None)  # on a terminal only: pytest's stderr is none
    reader.load(path, progress=False)
    assert capsys.readouterr().err == ""
    quiet = progress.Progress("x", enabled=False, stream=out)
    quiet.show("nothing")
    assert "nothing" not in out.getvalue()
