"""The analysis table every reader builds: Chrome trace complete events ('X') as one row per slice,
with their args spread into columns (COLUMNS). `kind` says what an interval is to the overlap
analysis: compute, comm (in flight), wait, step (a step window) or other (ignored).
"""
from __future__ import annotations

from itertools import repeat

import numpy as np
import pandas as pd

COLUMNS = ["rank", "track", "tid", "name", "cat", "kind", "device", "ts", "dur", "end", "step",
           "mb", "chunk", "layer", "op", "group", "bytes", "peer", "cpu_us", "correlation", "transfer_us"]
ARG_KEYS = ["step", "mb", "chunk", "layer", "op", "group", "bytes", "peer", "cpu_us", "correlation",
            "transfer_us", "partui"]  # partui: a `partui run --profile` range's category (partui.profile)
TEXT_ARGS = ("op", "group", "partui")  # the other args are numbers
TOP_FIELDS = ("name", "cat", "pid", "tid", "ts", "dur")
EMPTY: dict = {}  # the args of an event without any (never written to)


class TraceError(ValueError):
    """A file that cannot be analysed; the message names the file and the problem."""


def _numbers(values: list) -> np.ndarray:
    """float64 of a column read from JSON: None -> NaN; anything not a number -> NaN too."""
    try:
        return np.array(values, dtype=float)
    except (TypeError, ValueError):
        return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=float)


def _labels(values) -> pd.Categorical:
    """A string column as a categorical: few distinct names, so comparisons test codes, not strings."""
    values = np.array(values, dtype=object)
    try:
        codes, labels = pd.factorize(values, sort=True)  # ~2x faster than pd.Categorical(list)
    except TypeError:  # labels of mixed types (text and numbers) do not sort
        codes, labels = pd.factorize(values)
    return pd.Categorical.from_codes(codes, labels)


def slices(events: list) -> pd.DataFrame:
    """The complete ('X') events as a frame with their args spread into columns, built column by
    column from the decoded dicts (no per-event row objects); string columns are categoricals."""
    xs = [e for e in events if e.get("ph") == "X"]
    args = list(map(dict.get, xs, repeat("args"), repeat(EMPTY)))  # no args: NaN
    if set(map(type, args)) != {dict}:
        args = [a if isinstance(a, dict) else EMPTY for a in args]
    cols = {f: [e.get(f) for e in xs] for f in TOP_FIELDS}  # a comprehension per field: the fastest here
    ts = _numbers(cols["ts"])
    keep = ~np.isnan(ts)
    dur = np.nan_to_num(_numbers(cols["dur"]), nan=0.0)
    df = pd.DataFrame({"name": _labels(cols["name"]), "cat": _labels(cols["cat"]),
                       "pid": _ids(cols["pid"]), "tid": _ids(cols["tid"]),
                       "ts": ts, "dur": dur})
    present = set().union(*args)  # one C-level pass; absent keys cost no per-event lookup
    for key in ARG_KEYS:
        if key not in present:
            df[key] = pd.Categorical([None] * len(df)) if key in TEXT_ARGS else np.full(len(df), np.nan)
            continue
        got = [a.get(key) for a in args]
        df[key] = _labels(got) if key in TEXT_ARGS else _numbers(got)
    if not keep.all():
        df = df[keep].reset_index(drop=True)
    df["end"] = df["ts"].to_numpy() + df["dur"].to_numpy()
    return df


def _ids(values: list) -> np.ndarray:
    """pids / tids: int64 when every one is an int (partui's), else as read (Kineto's may be text)."""
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array(values, dtype=object)


def thread_names(events: list) -> dict:
    return {(e.get("pid"), e.get("tid")): e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "thread_name" and "args" in e}


def track_names(df: pd.DataFrame, events: list) -> pd.Categorical:
    """Each slice's thread name, else its tid as text: looked up once per distinct (pid, tid)."""
    names = thread_names(events)
    pcode, pids = pd.factorize(df["pid"].to_numpy())
    tcode, tids = pd.factorize(df["tid"].to_numpy())
    pair = pcode.astype(np.int64) * max(len(tids), 1) + tcode
    inverse, combo = pd.factorize(pair)  # hashing: a few distinct pairs among a million
    labels = [names.get((pids[c // max(len(tids), 1)], tids[c % max(len(tids), 1)]),
                        str(tids[c % max(len(tids), 1)])) for c in combo]
    uniq = list(dict.fromkeys(labels))
    code = np.array([uniq.index(x) for x in labels], dtype=np.int64)
    return pd.Categorical.from_codes(code[inverse] if len(combo) else np.zeros(0, np.int64), uniq)


def finish(df: pd.DataFrame) -> pd.DataFrame:
    """The reader's columns, kinds as a categorical, rows in (rank, ts) order."""
    for col in ("name", "cat", "op", "group", "track", "kind", "device"):
        if not isinstance(df[col].dtype, pd.CategoricalDtype):
            df[col] = _labels(df[col].to_numpy(dtype=object))
    df["rank"] = df["rank"].astype("int64")
    order = np.lexsort((df["ts"].to_numpy(), df["rank"].to_numpy()))  # stable: ties keep file order
    return df[COLUMNS].take(order).reset_index(drop=True)
