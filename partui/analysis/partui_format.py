"""partui's own trace format (partui.tracefile: metadata.format "partui-trace/1") into the analysis
table: pid is the rank, the recorder's categories say comm / wait / step, compute tracks compute."""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.events import finish, slices, track_names
from partui.tracefile import FORMAT


def is_partui(doc: dict) -> bool:
    meta = doc.get("metadata")
    return isinstance(meta, dict) and str(meta.get("format", "")).startswith(FORMAT.split("/")[0])


def partui_frame(doc: dict) -> pd.DataFrame:
    events = doc["traceEvents"]
    df = slices(events)
    df["track"] = track_names(df, events)
    df["rank"] = df["pid"]
    on_compute = df["track"].str.startswith("compute")
    cat = df["cat"].astype(str)
    df["kind"] = np.select([cat == "comm", cat == "wait", cat == "step", on_compute],
                           ["comm", "wait", "step", "compute"], "other")
    df["device"] = "cpu"
    return finish(df)
