"""The analysis table of a trace kept beside it as parquet, so a trace read once opens at once.

`TRACE.json` -> `.TRACE.json.partui.parquet` in the same folder (a folder of per-rank traces: its
own `.partui.parquet`). The cache is keyed by each trace file's size and mtime (nanoseconds), the
`--comm-kernels` patterns, and this reader's version: any change and it is read again and
rewritten; it is never trusted over a changed trace. Written to a temporary file and renamed, so a
crash leaves the old cache or none. Traces under MIN_BYTES are not cached (they read in well under
a second); PARTUI_TRACE_CACHE=0 turns the cache off; without pyarrow there is none.

A number column no event fills (events.missing: one shared NaN) is not written, only named, and is
shared again on reading; the rest is read a column at a time, each converted and its arrow memory freed
before the next, so reading a cache peaks near the table itself, not twice it. What parquet cannot hold
as it is comes back as the trace's own reading gives it: an object column of mixed ids (a torch.profiler
tid: ints and "Spans") is written as codes, its distinct values kept in the cache's metadata as JSON
(which keeps an int an int); a categorical's object-typed categories come back object-typed.
"""
from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pandas as pd

from partui.analysis.table.events import COLUMNS, frame_of, is_missing, missing

VERSION = 4  # bump when the analysis table changes meaning: every older cache is then stale
MIN_BYTES = 16 << 20
SUFFIX = ".partui.parquet"
KEY = b"partui.cache"
WRITE_ROWS = 1 << 20  # rows converted to arrow and written at a time (one row group each)


def cache_path(path: str) -> str:
    if os.path.isdir(path):
        return os.path.join(path, SUFFIX)
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}{SUFFIX}")


def stamp(path: str, files: list[str], comm_kernels) -> dict:
    """What the cache must match: each trace file's name, size and mtime; the patterns; the version."""
    stats = [(os.path.basename(f), os.stat(f)) for f in files]
    return {"version": VERSION, "columns": COLUMNS, "comm_kernels": list(comm_kernels),
            "files": [[n, s.st_size, s.st_mtime_ns] for n, s in stats]}


def enabled(files: list[str]) -> bool:
    if os.environ.get("PARTUI_TRACE_CACHE", "1") == "0" or sum(os.path.getsize(f) for f in files) < MIN_BYTES:
        return False
    try:
        import pyarrow  # noqa: F401  optional: parquet needs it
    except ImportError:
        return False
    return True


def get(path: str, files: list[str], comm_kernels) -> pd.DataFrame | None:
    """The cached table with its attrs, or None (no cache, a stale one, an unreadable one)."""
    where = cache_path(path)
    if not os.path.isfile(where):
        return None
    import pyarrow.parquet as pq
    try:
        meta = pq.read_schema(where).metadata or {}
        saved = json.loads(meta.get(KEY, b"{}"))
        if saved.get("stamp") != stamp(path, files, comm_kernels):
            return None
        df = _read_columns(pq.ParquetFile(where), saved)
    except (OSError, ValueError, TypeError):  # a damaged cache is read past, never trusted
        return None
    df.attrs.clear()
    df.attrs.update(saved["attrs"])  # format, world_size, metadata: the reader adds path and patterns
    if "unrecorded" in df.attrs:   # a tuple, as the trace's own reading gives it (json wrote a list)
        df.attrs["unrecorded"] = tuple(df.attrs["unrecorded"])
    return df


def _read_columns(parquet, saved: dict) -> pd.DataFrame:
    """The cached frame, a column at a time (each column's arrow memory freed once converted), the
    columns put never wrote (`missing`) shared NaNs again, in the table's own order."""
    rows = parquet.metadata.num_rows
    cols = {}
    for name in saved.get("order") or parquet.schema_arrow.names:
        if name in saved.get("missing", ()):
            cols[name] = missing(rows)
            continue
        part = parquet.read(columns=[name]).to_pandas(self_destruct=True, split_blocks=True)
        col = part[name]
        del part
        if name in saved.get("objects", {}):   # codes into the values as the trace's reading gave them
            col = pd.Series(np.array(saved["objects"][name] + [None], dtype=object)[col.to_numpy()], name=name)
        elif name in saved.get("object_categories", ()):
            col = pd.Series(pd.Categorical.from_codes(col.cat.codes.to_numpy(), pd.Index(
                col.cat.categories.astype(object), dtype=object)), name=name)
        cols[name] = col
    return frame_of(cols)


def object_codes(col: pd.Series) -> tuple[np.ndarray, list]:
    """An object column as (int32 codes, -1 for a missing value; its distinct values in the order met),
    each value as JSON keeps it (ints and text: what events.ids leaves as objects)."""
    codes, uniques = pd.factorize(col.to_numpy(), use_na_sentinel=True)
    return codes.astype(np.int32), [v.item() if isinstance(v, np.generic) else v for v in uniques]


def put(path: str, files: list[str], comm_kernels, df: pd.DataFrame) -> bool:
    """Write the cache beside the trace; False (and nothing written) where it cannot be."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    attrs = {"format": df.attrs.get("format"), "world_size": df.attrs.get("world_size"),
             "metadata": dict(df.attrs.get("metadata") or {})}
    if df.attrs.get("unrecorded"):                 # figures the trace cannot give: '-' / null
        attrs["unrecorded"] = list(df.attrs["unrecorded"])
    where = cache_path(path)
    try:
        # named, not written; only float columns looked at (a categorical's to_numpy is a string a row)
        shared = [c for c in df.columns if df[c].dtype == "float64" and is_missing(df[c].to_numpy())]
        kept = [c for c in df.columns if c not in shared]
        objects = {c: object_codes(df[c]) for c in kept if df[c].dtype == object}
        object_categories = [c for c in kept if isinstance(df[c].dtype, pd.CategoricalDtype)
                             and df[c].cat.categories.dtype == object]
        saved = json.dumps({"stamp": stamp(path, files, comm_kernels), "attrs": attrs, "order": list(df.columns),
                            "missing": shared, "objects": {c: values for c, (_, values) in objects.items()},
                            "object_categories": object_categories}).encode()
        fd, tmp = tempfile.mkstemp(prefix=f".partial-{os.getpid()}-", suffix=".tmp",
                                   dir=os.path.dirname(where))
    except (OSError, TypeError, ValueError, pa.ArrowException):  # read-only folder, odd values
        return False
    try:   # a slice of rows at a time: arrow never holds a copy of the whole table
        with os.fdopen(fd, "wb") as f:
            writer = None
            for lo in range(0, max(len(df), 1), WRITE_ROWS):
                rows = df.iloc[lo:lo + WRITE_ROWS][kept]
                if objects:   # codes in place of mixed-type objects (the values are in the metadata)
                    rows = rows.assign(**{c: codes[lo:lo + WRITE_ROWS] for c, (codes, _) in objects.items()})
                part = pa.Table.from_pandas(rows, preserve_index=False)
                del rows
                if writer is None:
                    schema = part.schema.with_metadata({**(part.schema.metadata or {}), KEY: saved})
                    writer = pq.ParquetWriter(f, schema, compression="zstd")
                writer.write_table(part.replace_schema_metadata(schema.metadata))
                del part
            writer.close()
        os.replace(tmp, where)
        return True
    except (OSError, TypeError, ValueError, pa.ArrowException):  # odd values, a full disk: no cache
        if os.path.exists(tmp):
            os.unlink(tmp)
        return False
