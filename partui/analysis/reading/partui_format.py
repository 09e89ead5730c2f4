"""partui's own trace format (partui.recording.tracefile: metadata.format "partui-trace/1") into the analysis
table: pid is the rank, the recorder's categories say comm / wait / step / container, and the rest
of a compute track is compute, but viztracer's calls (cat FEE) there, which are "other" (definitions:
partui.analysis.figures.definitions)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.table.events import finish, slices, thread_names, track_names
from partui.recording.tracefile import FORMAT
from planning.intervals import CONTAINER_CATS as SPAN_CONTAINERS
from planning.intervals import WAIT_CATS

# the engine's step figures count the same categories (planning.intervals.figures)
CONTAINER_CATS = tuple(c for c in SPAN_CONTAINERS if c != "step")  # FB, microbatch: never compute
PYTHON_CAT = "FEE"  # viztracer's calls (partui.recording.trace puts them on the compute track): other


def is_partui(doc: dict) -> bool:
    meta = doc.get("metadata")
    return isinstance(meta, dict) and str(meta.get("format", "")).startswith(FORMAT.split("/")[0])


def partui_frame(doc: dict) -> pd.DataFrame:
    events = doc["traceEvents"]
    return partui_table(slices(events), thread_names(events))


def partui_table(df: pd.DataFrame, names: dict, doc: dict | None = None, comm_kernels=()) -> pd.DataFrame:
    """The analysis table of a trace's slices (events.slices) and thread names (events.thread_names)."""
    df["track"] = track_names(df, names)
    df["rank"] = df["pid"]
    names = df["track"].cat.categories  # a few names (each used): test those, not each row
    on_compute = df["track"].isin([n for n in names if str(n).startswith("compute")])
    cat = df["cat"]  # a categorical: each test below compares codes
    # a comm-category span on a compute track is the rank blocked on comm (older traces' ZeRO-3 wait)
    kinds = ["comm", "wait", "step", "container", "compute", "other"]
    code = np.select([(cat == "comm") & ~on_compute, cat.isin(WAIT_CATS) | (cat == "comm"),
                      cat == "step", cat.isin(CONTAINER_CATS), on_compute & (cat != PYTHON_CAT)],
                     range(5), 5)
    df["kind"] = pd.Categorical.from_codes(code, kinds)  # codes: no million-string column
    df["device"] = pd.Categorical.from_codes(np.zeros(len(df), dtype=np.int64), ["cpu"])
    return finish(df, consume=True)  # df: this reader's own table of slices
