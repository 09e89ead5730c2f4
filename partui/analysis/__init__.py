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

Each name loads its module on first use (module __getattr__): importing one room of the package
(`partui.analysis.definitions`, `.events`) does not import every other room with it.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what linters and readers see; at run time each name loads on first use
    from partui.analysis.blame import blame_line, blame_text
    from partui.analysis.definitions import definitions_of
    from partui.analysis.events import COLUMNS, TraceError
    from partui.analysis.metrics import hta_overlap, overlap, overlap_views, oversubscription_note, step_times
    from partui.analysis.pairs import fb_pair_a2a, pair_summary
    from partui.analysis.partui_graph import partui_graphs
    from partui.analysis.pipeline import theoretical_bubble
    from partui.analysis.reader import detect, frame, load, read_doc
    from partui.analysis.whatif import SAVED_COLUMNS, saved

_HOME = {  # public name -> the module that defines it
    "blame_line": "blame", "blame_text": "blame", "definitions_of": "definitions",
    "COLUMNS": "events", "TraceError": "events",
    "hta_overlap": "metrics", "overlap": "metrics", "overlap_views": "metrics",
    "oversubscription_note": "metrics", "step_times": "metrics",
    "fb_pair_a2a": "pairs", "pair_summary": "pairs", "partui_graphs": "partui_graph",
    "theoretical_bubble": "pipeline", "detect": "reader", "frame": "reader", "load": "reader",
    "read_doc": "reader", "SAVED_COLUMNS": "whatif", "saved": "whatif",
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
