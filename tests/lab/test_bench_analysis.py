"""`partui bench analysis`'s written traces: a k-tile torch.profiler trace holds k shifted copies of
one tile, so its report's additive figures are k times one tile's (the bench's multi-GB check),
counted here against the tile's own events by hand; a real trace repeated keeps its events."""
from __future__ import annotations

import json

from partui.analysis import load
from partui.bench.analysis_scale import (kineto_tile, report_figures, repeat_trace, scaled_mismatch,
                                         tile_span, write_tiles)


def test_three_tiles_report_three_times_one_tiles_figures(tmp_path):
    one, three = str(tmp_path / "one.json"), str(tmp_path / "three.json")
    write_tiles(one, 300, 1)
    write_tiles(three, 300, 3)
    small, big = report_figures(load(one)), report_figures(load(three))
    assert scaled_mismatch(big, small, 3) == []
    tile = [e for e in kineto_tile(300, 0, tile_span(300)) if e["cat"] == "kernel"]
    nccl = [e for e in tile if e["name"].startswith("nccl")]
    assert small["family kernels"] == len(nccl) and big["family kernels"] == 3 * len(nccl)
    assert abs(big["family kernel_ms"] - 3e-3 * sum(e["dur"] for e in nccl)) < 1e-9
    assert scaled_mismatch(big, small, 2)  # the check can fail: a wrong k is caught
    doc = json.load(open(three))  # a well-formed torch.profiler trace, as torch.profiler lays it out
    assert doc["traceName"] and len(doc["traceEvents"]) == 2 + 3 * (2 * 300 + 3)


def test_a_repeated_trace_holds_each_event_once_per_copy_shifted(tmp_path):
    src = tmp_path / "src.json"
    events = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "stream 7"}},
              {"ph": "X", "name": "k", "cat": "kernel", "pid": 0, "tid": 1, "ts": 10.0, "dur": 5.0,
               "args": {"correlation": 4}}]
    src.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    out = json.load(open(repeat_trace(str(src), str(tmp_path / "out.json"), 3)))["traceEvents"]
    xs = [e for e in out if e["ph"] == "X"]
    assert len(out) == 4 and [e["args"]["correlation"] for e in xs] == [4, 9, 14]
    assert [e["ts"] for e in xs] == [10.0, 10.0 + 1005.0, 10.0 + 2010.0]  # span 5 us + 1 ms apart
