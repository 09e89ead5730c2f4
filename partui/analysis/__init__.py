"""Trace analysis: overlap, exposed comm, idle and bubble, from partui or torch.profiler traces.

    from partui.analysis import load, overlap
    df = load("traces/run.json")      # reader: detects the format (partui_format, kineto)
    overlap(df, by="rank")            # metrics: or "step", "op"
    overlap_views(df)                 # {"rank", "step", "op"}: shared work computed once
    fb_pair_a2a(df)                   # pairs: each all-to-all inside an F&B pair (fb_overlap)
    saved(read_doc(path), link)       # whatif: what overlap saves under a link (replayed)
    definitions_of(["exposed_comm_ms"])   # what a figure counts: the one table (definitions)
    blame_line(partui_graphs(doc))    # blame: the slowest worker and its cost, one line
    blame_text(partui_graphs(doc))    # that line and the blame table's top rows (the Trace tab)

Each name loads its module on first use (module __getattr__): importing one module of the package
(`partui.analysis.figures.definitions`, `partui.analysis.table.events`) does not import every other
module with it.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what linters and readers see; at run time each name loads on first use
    from partui.analysis.replay.blame import blame_line, blame_text
    from partui.analysis.figures.definitions import definitions_of
    from partui.analysis.table.events import COLUMNS, TraceError
    from partui.analysis.figures.metrics import (hta_overlap, overlap, overlap_views, oversubscription_note,
                                                 step_times)
    from partui.analysis.figures.pairs import fb_pair_a2a, pair_summary
    from partui.analysis.replay.partui_graph import partui_graphs
    from partui.analysis.figures.pipeline import theoretical_bubble
    from partui.analysis.reading.reader import detect, frame, load, read_doc
    from partui.analysis.replay.whatif import SAVED_COLUMNS, saved

_HOME = {  # public name -> the module that defines it
    "blame_line": "replay.blame", "blame_text": "replay.blame",
    "definitions_of": "figures.definitions",
    "COLUMNS": "table.events", "TraceError": "table.events",
    "hta_overlap": "figures.metrics", "overlap": "figures.metrics", "overlap_views": "figures.metrics",
    "oversubscription_note": "figures.metrics", "step_times": "figures.metrics",
    "fb_pair_a2a": "figures.pairs", "pair_summary": "figures.pairs",
    "partui_graphs": "replay.partui_graph",
    "theoretical_bubble": "figures.pipeline", "detect": "reading.reader", "frame": "reading.reader",
    "load": "reading.reader", "read_doc": "reading.reader", "SAVED_COLUMNS": "replay.whatif",
    "saved": "replay.whatif",
}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'partui.analysis' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"partui.analysis.{_HOME[name]}"), name)
    globals()[name] = value  # once: later lookups find it without this hook
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
