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
"""
from partui.analysis.blame import blame_line, blame_text
from partui.analysis.definitions import definitions_of
from partui.analysis.events import COLUMNS, TraceError
from partui.analysis.metrics import hta_overlap, overlap, overlap_views, oversubscription_note, step_times
from partui.analysis.pairs import fb_pair_a2a, pair_summary
from partui.analysis.partui_graph import partui_graphs
from partui.analysis.pipeline import theoretical_bubble
from partui.analysis.reader import detect, frame, load, read_doc
from partui.analysis.whatif import SAVED_COLUMNS, saved

__all__ = ["COLUMNS", "SAVED_COLUMNS", "TraceError", "blame_line", "blame_text", "definitions_of", "detect", "fb_pair_a2a", "frame",
           "hta_overlap", "load",
           "overlap", "overlap_views", "oversubscription_note", "pair_summary", "partui_graphs", "read_doc", "saved", "step_times",
           "theoretical_bubble"]
