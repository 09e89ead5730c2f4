"""The analysis table every reader builds: Chrome trace complete events ('X') as one row per slice,
with their args spread into columns (COLUMNS). `kind` says what an interval is to the overlap
analysis: compute, comm (in flight), wait, step (a step window) or other (ignored).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ["rank", "track", "tid", "name", "cat", "kind", "device", "ts", "dur", "end", "step",
           "mb", "chunk", "layer", "op", "group", "bytes", "peer", "cpu_us", "correlation", "transfer_us"]
ARG_KEYS = ["step", "mb", "chunk", "layer", "op", "group", "bytes", "peer", "cpu_us", "correlation",
            "transfer_us"]


class TraceError(ValueError):
    """A file that cannot be analysed; the message names the file and the problem."""


def slices(events: list) -> pd.DataFrame:
    """The complete ('X') events as a frame with their args spread into columns."""
    df = pd.DataFrame.from_records(events, columns=["ph", "name", "cat", "pid", "tid", "ts", "dur",
                                                    "args"])
    df = df[df["ph"] == "X"].reset_index(drop=True)
    args = df["args"].tolist()
    args = [a if isinstance(a, dict) else {} for a in args]  # events without args read as NaN
    wide = pd.DataFrame.from_records(args) if any(args) else pd.DataFrame(index=df.index)
    for key in ARG_KEYS:
        df[key] = wide[key].to_numpy() if key in wide else np.nan
    df["ts"] = pd.to_numeric(df["ts"], errors="coerce")
    df["dur"] = pd.to_numeric(df["dur"], errors="coerce").fillna(0.0)
    df = df[df["ts"].notna()]
    df["end"] = df["ts"] + df["dur"]
    return df.drop(columns=["args", "ph"])


def thread_names(events: list) -> dict:
    return {(e.get("pid"), e.get("tid")): e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "thread_name" and "args" in e}


def track_names(df: pd.DataFrame, events: list) -> pd.Series:
    """Each slice's thread name (a join on (pid, tid), not a lookup per row); else the tid."""
    names = pd.DataFrame([(p, t, n) for (p, t), n in thread_names(events).items()],
                         columns=["pid", "tid", "track"])
    joined = df[["pid", "tid"]].merge(names, on=["pid", "tid"], how="left")["track"]
    return pd.Series(joined.to_numpy(), index=df.index).fillna(df["tid"].astype(str))


def finish(df: pd.DataFrame) -> pd.DataFrame:
    for col in ("step", "mb", "chunk", "layer", "bytes", "peer", "cpu_us", "correlation", "transfer_us"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    for col in ("name", "cat", "op", "group", "track"):
        df[col] = df[col].astype("string")
    df["rank"] = df["rank"].astype("int64")
    return df[COLUMNS].sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)
