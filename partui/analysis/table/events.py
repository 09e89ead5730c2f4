"""The analysis table every reader builds: Chrome trace complete events ('X') as one row per slice,
with their args spread into columns (COLUMNS). `kind` says what an interval is to the overlap
analysis: compute, comm (in flight), wait, step (a step window) or other (ignored).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.table.event_columns import (  # noqa: F401  re-exported: the pandas-free half
    ARG_KEYS, EMPTY, TEXT_ARGS, TOP_FIELDS, TraceError, ids, is_missing, missing, numbers, slice_columns,
    thread_names)

COLUMNS = ["rank", "track", "tid", "name", "cat", "kind", "device", "ts", "dur", "end", "step",
           "mb", "chunk", "layer", "op", "group", "bytes", "peer", "cpu_us", "correlation", "transfer_us"]


def labels(values) -> pd.Categorical:
    """A string column as a categorical: few distinct names, so comparisons test codes, not strings."""
    values = np.array(values, dtype=object)
    try:
        codes, uniques = pd.factorize(values, sort=True)  # ~2x faster than pd.Categorical(list)
    except TypeError:  # labels of mixed types (text and numbers) do not sort
        codes, uniques = pd.factorize(values)
    return pd.Categorical.from_codes(codes, uniques)


# one Series of missing() NaNs per length, kept for good (each a few hundred bytes, no row's worth):
# a frame's shared column then always has another holder, so pandas' copy on write gives a write into
# it (df.loc[i, "mb"] = 1) the frame's own copy instead of writing into the read-only view
_HELD_NAN: dict[int, pd.Series] = {}


def frame_of(columns: dict) -> pd.DataFrame:
    """The frame of these columns as they are (no copy); missing() columns stay shared and writable."""
    def held(n: int) -> pd.Series:
        if n not in _HELD_NAN:
            _HELD_NAN[n] = pd.Series(missing(n), copy=False)
        return _HELD_NAN[n]
    return pd.DataFrame({key: held(len(values)) if is_missing(values) else values
                         for key, values in columns.items()}, copy=False)


def table(cols: dict) -> pd.DataFrame:
    """The slices table of complete events' columns (slice_columns' or columns.Columns'): text as
    categoricals, a missing duration 0, rows without a time dropped, and each slice's end."""
    ts = cols["ts"]
    keep = ~np.isnan(ts)
    text = lambda v: v if isinstance(v, pd.Categorical) else labels(v)  # noqa: E731
    data = {"name": text(cols["name"]), "cat": text(cols["cat"]), "pid": cols["pid"], "tid": cols["tid"],
            "ts": ts, "dur": np.nan_to_num(cols["dur"], nan=0.0)}
    data.update({key: text(cols[key]) if key in TEXT_ARGS else cols[key] for key in ARG_KEYS})
    data["end"] = data["ts"] + data["dur"]
    if not keep.all():  # the rows with a time; missing() columns stay shared
        data = {key: missing(int(keep.sum())) if is_missing(values) else values[keep]
                for key, values in data.items()}
    return frame_of(data)  # the columns as built: a dict's arrays are otherwise copied


def slices(events: list) -> pd.DataFrame:
    """The complete ('X') events as a frame with their args spread into columns; string columns
    are categoricals."""
    return table(slice_columns(events))


def track_names(df: pd.DataFrame, names: dict) -> pd.Categorical:
    """Each slice's thread name (names: thread_names' (pid, tid) -> name), else its tid as text:
    looked up once per distinct (pid, tid)."""
    pair, pids = pd.factorize(df["pid"].to_numpy())
    tcode, tids = pd.factorize(df["tid"].to_numpy())
    width = max(len(tids), 1)
    pair *= width  # in place: a few row-length arrays held at once, not five
    pair += tcode
    del tcode
    inverse, combo = pd.factorize(pair)  # hashing: a few distinct pairs among a million
    del pair
    named = [names.get((pids[c // width], tids[c % width]), str(tids[c % width])) for c in combo]
    uniq = list(dict.fromkeys(named))
    code = np.array([uniq.index(x) for x in named], dtype=np.int8 if len(uniq) < 128 else np.int32)
    return pd.Categorical.from_codes(code[inverse] if len(combo) else np.zeros(0, np.int8), uniq)


def finish(df: pd.DataFrame, consume: bool = False) -> pd.DataFrame:
    """The reader's columns, kinds as a categorical, rows in (rank, ts) order. consume=True: df is
    the reader's own scratch table, each of its columns dropped once its sorted copy is made (the
    table is never held twice over)."""
    for col in ("name", "cat", "op", "group", "track", "kind", "device"):
        if not isinstance(df[col].dtype, pd.CategoricalDtype):
            df[col] = labels(df[col].to_numpy(dtype=object))
    df["rank"] = df["rank"].astype("int64")
    if consume:  # the scratch columns the table does not keep (pid, tid, args): gone before the sort
        for col in [c for c in df.columns if c not in COLUMNS]:
            del df[col]
    order = rank_time_order(df["rank"].to_numpy(), df["ts"].to_numpy())
    columns = {}
    for col in COLUMNS:
        values = df[col].array
        columns[col] = (values if order is None else missing(len(order)) if is_missing(values)
                        else values.take(order))
        if consume:
            del df[col]
    out = frame_of(columns)
    out.attrs.update(df.attrs)
    return out


def rank_time_order(rank: np.ndarray, ts: np.ndarray) -> np.ndarray | None:
    """The stable (rank, ts) order of rows (ties keep file order, as np.lexsort), or None when they
    are in it already. Two stable passes, time then rank: a rank's codes sort by radix, ~2x faster
    than lexsort on a million rows."""
    if len(rank) and rank.min() == rank.max():  # one rank (a torch.profiler file): time alone
        return None if np.all(ts[1:] >= ts[:-1]) else np.argsort(ts, kind="stable")
    same = rank[1:] == rank[:-1]
    if np.all((rank[1:] > rank[:-1]) | (same & (ts[1:] >= ts[:-1]))):
        return None
    order = np.argsort(ts, kind="stable")
    codes, ranks = pd.factorize(rank[order], sort=True)
    kind = np.uint16 if len(ranks) < 2**16 else np.int64
    return order[np.argsort(codes.astype(kind), kind="stable")]
