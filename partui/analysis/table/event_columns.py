"""The complete ('X') events of decoded trace dicts as columns of values, without pandas: the half of
the events table (events.py) that a streamed read needs (columns, stream_events), so that a reader
of numpy arrays (the lean reports) never pays pandas' import (~0.6 s).
"""
from __future__ import annotations

import sys
from itertools import repeat

import numpy as np

ARG_KEYS = ["step", "mb", "chunk", "layer", "op", "group", "bytes", "peer", "cpu_us", "correlation",
            "transfer_us", "partui"]  # a `partui run --profile` range's category (partui.recording.profile)
TEXT_ARGS = ("op", "group", "partui")  # the other args are numbers
TOP_FIELDS = ("name", "cat", "pid", "tid", "ts", "dur")
EMPTY: dict = {}  # the args of an event without any (never written to)


class TraceError(ValueError):
    """A file that cannot be analysed; the message names the file and the problem."""


def numbers(values) -> np.ndarray:
    """float64 of a column read from JSON: None -> NaN; text that spells a number -> that number (as
    pandas' to_numeric reads it), anything else -> NaN."""
    try:
        return np.array(values, dtype=float)
    except (TypeError, ValueError):
        return np.fromiter(map(_number, values), dtype=float, count=len(values))


def _number(value) -> float:
    if isinstance(value, (int, float)):  # bool too: True -> 1.0
        return float(value)
    if isinstance(value, (str, bytes)) and b"_" not in (value if isinstance(value, bytes) else value.encode()):
        try:  # float() would read "1_0" as 10; to_numeric does not
            return float(value)
        except ValueError:
            pass
    return float("nan")


def slice_columns(events: list) -> dict:
    """The complete ('X') events' fields and args as columns of values, built column by column
    from the decoded dicts (no per-event row objects): text as objects, numbers as floats."""
    xs = [e for e in events if e.get("ph") == "X"]
    args = list(map(dict.get, xs, repeat("args"), repeat(EMPTY)))  # no args: NaN
    if set(map(type, args)) != {dict}:
        args = [a if isinstance(a, dict) else EMPTY for a in args]
    cols = {f: [e.get(f) for e in xs] for f in TOP_FIELDS}  # a comprehension per field: the fastest here
    out = {"name": np.array(cols["name"], dtype=object), "cat": np.array(cols["cat"], dtype=object),
           "pid": ids(cols["pid"]), "tid": ids(cols["tid"]),
           "ts": numbers(cols["ts"]), "dur": numbers(cols["dur"])}
    present = set().union(*args)  # one C-level pass; absent keys cost no per-event lookup
    for key in ARG_KEYS:
        if key not in present:
            out[key] = np.full(len(xs), None, dtype=object) if key in TEXT_ARGS else missing(len(xs))
            continue
        got = [a.get(key) for a in args]
        out[key] = np.array(got, dtype=object) if key in TEXT_ARGS else numbers(got)
    return out


def missing(n: int) -> np.ndarray:
    """n NaNs that cost no memory a row: one shared NaN seen n times (a read-only, zero-stride view).
    A number column no event fills (a torch.profiler trace's mb, chunk, layer, bytes, peer, cpu_us,
    transfer_us: 56 of a row's ~119 bytes) reads as any float column; events.frame_of puts it in a frame."""
    return np.broadcast_to(np.float64(np.nan), (n,))


def is_missing(values) -> bool:
    """Whether a column is missing()'s shared NaNs (kept shared when rows are reordered or picked)."""
    if not isinstance(values, np.ndarray):  # a frame's column array: pandas is loaded if it is one
        pd = sys.modules.get("pandas")
        if pd is not None and isinstance(values, pd.arrays.NumpyExtensionArray):
            values = values.to_numpy()  # no copy
    return isinstance(values, np.ndarray) and values.ndim == 1 and len(values) > 0 and values.strides == (0,) \
        and values.dtype == np.float64 and np.isnan(values[0])


def ids(values) -> np.ndarray:
    """pids / tids: int64 when every one is an int (partui's), else as read (Kineto's may be text)."""
    try:
        return np.array(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return np.array(values, dtype=object)


def thread_names(events: list) -> dict:
    return {(e.get("pid"), e.get("tid")): e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "thread_name" and "args" in e}
