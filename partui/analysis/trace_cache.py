"""The analysis table of a trace kept beside it as parquet, so a trace read once opens at once.

`TRACE.json` -> `.TRACE.json.partui.parquet` in the same folder (a folder of per-rank traces: its
own `.partui.parquet`). The cache is keyed by each trace file's size and mtime (nanoseconds), the
`--comm-kernels` patterns, and this reader's version: any change and it is read again and
rewritten; it is never trusted over a changed trace. Written to a temporary file and renamed, so a
crash leaves the old cache or none. Traces under MIN_BYTES are not cached (they read in well under
a second); PARTUI_TRACE_CACHE=0 turns the cache off; without pyarrow there is none.
"""
from __future__ import annotations

import json
import os
import tempfile

import pandas as pd

from partui.analysis.events import COLUMNS

VERSION = 2  # bump when the analysis table changes meaning: every older cache is then stale
MIN_BYTES = 16 << 20
SUFFIX = ".partui.parquet"
KEY = b"partui.cache"


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
        table = pq.read_table(where)
        # each column freed as it is converted, none consolidated: the table is never held twice
        df = table.to_pandas(self_destruct=True, split_blocks=True)
        del table
    except (OSError, ValueError, TypeError):  # a damaged cache is read past, never trusted
        return None
    df.attrs.clear()
    df.attrs.update(saved["attrs"])  # format, world_size, metadata: the reader adds path and patterns
    return df


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
        saved = json.dumps({"stamp": stamp(path, files, comm_kernels), "attrs": attrs}).encode()
        table = pa.Table.from_pandas(df, preserve_index=False)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), KEY: saved})
        fd, tmp = tempfile.mkstemp(prefix=f".partial-{os.getpid()}-", suffix=".tmp",
                                   dir=os.path.dirname(where))
    except (OSError, TypeError, ValueError, pa.ArrowException):  # read-only folder, odd values
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            pq.write_table(table, f, compression="zstd")
        os.replace(tmp, where)
        return True
    except (OSError, pa.ArrowException):
        if os.path.exists(tmp):
            os.unlink(tmp)
        return False
