"""A trace file read batch by batch (json_stream) into the complete events' columns (columns.Columns),
with no pandas import: `read_streamed` for the frame readers (reader.read_table), `stream_events` for
readers of plain numpy arrays (the lean reports), which never pay pandas' ~0.6 s import.

    got = stream_events(path)       # None where the file is not laid out for streaming
    codes, names = got.text("name") # int32 codes (-1: missing) in file order, the names they number
    ts = got.numbers("ts")          # float64, NaN where missing
    pid = got.ids("pid")            # int64, or objects where a pid is text ("Spans")
"""
from __future__ import annotations

import json
import os
import zlib

import numpy as np

from partui.analysis.reading.columns import FIELDS, TEXT_COLUMNS, Columns
from partui.analysis.reading.json_stream import NotStreamable, batches
from partui.analysis.reading.progress import Progress, read_text


def decode(raw: bytes):
    """orjson when installed (a million-event trace decodes ~1.6x faster than with json)."""
    try:  # optional: a faster JSON decoder, when installed
        import orjson
    except ImportError:
        return json.loads(raw)
    return orjson.loads(raw)


def read_streamed(path: str, progress: Progress | None = None, use_arrow: bool = True, fields=FIELDS,
                  ) -> tuple[dict, Columns] | None:
    """The trace's other keys (with its last few events) and its events' columns, read batch by
    batch (json_stream); None where the file is not laid out for that: read it whole instead.
    use_arrow=False: every batch decoded as dicts (what a machine without pyarrow does). fields: the
    columns kept (Columns')."""
    cols = Columns(decode, use_arrow=use_arrow, fields=fields)
    gz = path.endswith(".gz")
    shown = (lambda st: progress.show(read_text(st.read, st.size, cols.events, gz))) if progress else (lambda st: None)
    try:
        walk = batches(path, os.path.getsize(path), decode, lambda text: cols.add_text(text) or None, shown)
        while True:
            try:
                next(walk)
            except StopIteration as stop:
                head = stop.value.head
                break
        events = head.get("traceEvents") if isinstance(head, dict) else None
        if not isinstance(events, list):
            return None
        cols.add_events(events)
    except (NotStreamable, TypeError, KeyError, IndexError, AttributeError, ValueError, EOFError, OSError,
            zlib.error):
        return None  # the whole-file read names what is wrong with it
    head["traceEvents"] = events[:1]  # what detect tests; the events are in cols
    return head, cols


class StreamedEvents:
    """A streamed trace's complete ('X') events as arrays, in file order: the rows and values of
    Columns.frame() before its table drops the rows without a time (and where the frame has a
    missing duration 0, `numbers("dur")` has NaN). Each column is joined once, when asked, and its
    parts freed: asking again is a KeyError."""

    def __init__(self, head: dict, cols: Columns):
        self.head = {k: v for k, v in head.items() if k != "traceEvents"}  # the document's other keys
        self.events = cols.events  # every event read, of any phase
        self.threads = cols.names  # {(pid, tid): thread name}, from the thread_name metadata events
        self.rows = cols.rows()  # complete events
        self.batches = cols.batches  # how many batches each decoder read ({"arrow": n, "dicts": n})
        self._cols = cols

    def text(self, key: str) -> tuple[np.ndarray, list]:
        """(int32 codes, -1 where missing; the names they number, in the order first met) of a text
        column: name, cat, or the args op, group, partui."""
        if key not in TEXT_COLUMNS:
            raise KeyError(f"{key!r} is not a text column; text columns: {', '.join(TEXT_COLUMNS)}")
        return self._cols.column(key)

    def numbers(self, key: str) -> np.ndarray:
        """float64 of a number column (ts, dur, or an arg such as correlation), NaN where missing;
        read-only (one shared NaN) where no event holds it."""
        if key in TEXT_COLUMNS or key in ("pid", "tid"):
            raise KeyError(f"{key!r} is not a number column (text: text(key); pid, tid: ids(key))")
        return self._cols.column(key)

    def ids(self, key: str) -> np.ndarray:
        """pid or tid: int64 when every one is an int, else objects as read (a text pid, None where missing)."""
        if key not in ("pid", "tid"):
            raise KeyError(f"{key!r} is not an id column: pid or tid")
        return self._cols.column(key)


def stream_events(path: str, progress: Progress | None = None, use_arrow: bool = True,
                  fields=FIELDS) -> StreamedEvents | None:
    """The trace's complete events as arrays (StreamedEvents), read batch by batch in bounded memory;
    None where the file is not laid out for streaming (the caller reads it whole, where its errors
    are named)."""
    got = read_streamed(path, progress, use_arrow, fields)
    return None if got is None else StreamedEvents(*got)
