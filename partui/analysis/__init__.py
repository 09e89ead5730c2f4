"""Trace analysis: overlap, exposed comm, idle and bubble, from partui or torch.profiler traces.

    from partui.analysis import load, overlap
    df = load("traces/run.json")      # reader: detects the format (partui_format, kineto)
    overlap(df, by="rank")            # metrics: or "step", "op"
"""
from partui.analysis.events import COLUMNS, TraceError
from partui.analysis.metrics import hta_overlap, overlap, oversubscription_note, step_times
from partui.analysis.pipeline import theoretical_bubble
from partui.analysis.reader import detect, frame, load, read_doc

__all__ = ["COLUMNS", "TraceError", "detect", "frame", "hta_overlap", "load", "overlap",
           "oversubscription_note", "read_doc", "step_times", "theoretical_bubble"]
