"""A trace format is one record (partui.analysis.reading.reader.FORMATS): registering one makes every reader
path — detect, load, the unknown-format message — know it, with no other file touched."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from partui.analysis.reading import reader
from partui.analysis.table.events import TraceError
from partui.analysis.figures.metrics import overlap

SAMPLE = Path(__file__).resolve().parents[2] / "traces" / "sample-dualpipev-ep.json.gz"


def wrapped(doc: dict) -> dict:
    """A throwaway format: a partui trace carried under another key, marked `wrapped: true`."""
    return {"wrapped": True, "traceEvents": [{"name": "marker", "ph": "i", "ts": 0}], "inner": doc}


@pytest.fixture
def with_wrapped_format(monkeypatch):
    fmt = reader.TraceFormat("wrapped", lambda doc: doc.get("wrapped") is True,
                             lambda doc, comm_kernels: reader.FORMAT_OF["partui"].read(doc["inner"], comm_kernels),
                             "a wrapped marker", "the test")
    monkeypatch.setattr(reader, "FORMATS", (*reader.FORMATS, fmt))
    monkeypatch.setitem(reader.FORMAT_OF, "wrapped", fmt)


def test_a_registered_format_reads_like_the_format_it_wraps(tmp_path, with_wrapped_format):
    with gzip.open(SAMPLE, "rt") as f:
        doc = json.load(f)
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps(wrapped(doc)))
    got = reader.load(str(path))
    want = reader.frame(doc, str(SAMPLE))
    assert got.attrs["format"] == "wrapped"
    assert len(got) == len(want) > 0
    assert overlap(got)["overlap_pct"].tolist() == overlap(want)["overlap_pct"].tolist()


def test_the_unknown_format_message_names_every_registered_format(with_wrapped_format):
    with pytest.raises(TraceError) as e:
        reader.detect({"traceEvents": [{"name": "x"}]})
    assert "a wrapped marker" in str(e.value) and "torch.profiler's schemaVersion" in str(e.value)
    assert "the test" in str(e.value)
