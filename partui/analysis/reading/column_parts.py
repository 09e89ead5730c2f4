"""A batch's complete events as parts this process owns, and the parts joined into the slices
table's columns one column at a time (columns.Columns drives both).

Why owned parts: a column converted from pyarrow without a copy stays a view of arrow's buffers,
and arrow's pool (mimalloc) hands memory back only when every buffer of a segment is gone; the
buffers of one batch's columns share segments, so views kept for the join held every batch's
arrow memory until the end (a 3 GB trace: ~600 MB on top of the columns). Copied out, each batch's
arrow table is dropped at once and its pool memory serves the next batch. Why one column at a
time, with the freed heap given back between columns on a big table (columns.TRIM_ROWS): the parts
of the columns already joined are returned before the next column is built, so the join holds the
parts plus one column, not twice the table.

Text is kept as codes from the start: each batch's names are numbered in the order this reader
first meets them (`Names`), a batch holds int32 codes, and the join maps them once to the sorted
categories events.labels would give, straight into the categorical's own small codes.
"""
from __future__ import annotations

import ctypes

from typing import TYPE_CHECKING

import numpy as np

from partui.analysis.table.event_columns import ids, missing

if TYPE_CHECKING:
    import pandas as pd


class Rows:
    """Which rows of a batch are complete ('X') events; `of(values)`: those rows of a column, as
    an array this process owns (never a view of arrow's buffers)."""

    def __init__(self, is_x):  # is_x: arrow booleans (a ChunkedArray), no nulls
        self.arrow = is_x
        self.mask = numpy_of(is_x, bool)
        self.every = bool(self.mask.all())
        self.n = int(self.mask.sum())

    def of(self, values: np.ndarray) -> np.ndarray:
        return owned(values) if self.every else values[self.mask]


def numpy_of(col, dtype) -> np.ndarray:
    """An arrow column of fixed-width values (an Array or ChunkedArray of float64, int64, int32 or
    bool) as numpy, read from its buffers: a view of them where one chunk allows, nulls NaN (floats).
    Why not to_numpy: pyarrow's conversion imports pandas first (~0.6 s), for a reader that never uses it."""
    chunks = [c for c in getattr(col, "chunks", [col]) if len(c)]
    parts = [chunk_numpy(c, dtype) for c in chunks]
    return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def chunk_numpy(chunk, dtype) -> np.ndarray:
    n, at = len(chunk), chunk.offset
    validity, data = chunk.buffers()[:2]
    if dtype is bool:  # one bit a value, the first the lowest
        values = np.unpackbits(np.frombuffer(data, np.uint8), count=at + n, bitorder="little")[at:].view(bool)
    else:
        values = np.frombuffer(data, dtype=dtype, count=at + n)[at:]
    if chunk.null_count:  # only floats hold nulls here (Rows' and the codes' are filled, ids' read as lists)
        valid = np.unpackbits(np.frombuffer(validity, np.uint8), count=at + n, bitorder="little")[at:].view(bool)
        values = np.where(valid, values, np.nan)
    return values


def owned(values: np.ndarray) -> np.ndarray:
    """values when numpy allocated them (a view's base chain ends in an array owning its data),
    else a copy: an arrow-backed view would keep its batch's arrow memory alive."""
    root = values
    while isinstance(root.base, np.ndarray):
        root = root.base
    return values if root.flags.owndata else values.copy()


def number_part(col, rows: Rows) -> np.ndarray | None:
    """A float column's complete rows (null: NaN); None when none of them holds a value."""
    if col.null_count == len(col) or not rows.n:
        return None
    values = rows.of(numpy_of(col, np.float64))
    return None if col.null_count and np.isnan(values).all() else values


def id_part(col, rows: Rows) -> np.ndarray:
    """pids / tids of the complete rows: int64, or objects (None where missing) as events.ids reads them."""
    if col.null_count:
        picked = col.filter(rows.arrow)
        return np.array(picked.to_pylist(), dtype=object) if picked.null_count else owned(numpy_of(picked, np.int64))
    return rows.of(numpy_of(col, np.int64))


class Names:
    """One text column's names, numbered in the order first met; batches hold their codes."""

    def __init__(self):
        self.seen: dict = {}

    def lookup(self, values) -> np.ndarray:
        """Each value's code (new ones numbered on, in the order given)."""
        seen = self.seen
        return np.array([seen.setdefault(v, len(seen)) for v in values], dtype=np.int32)

    def arrow_part(self, col, rows: Rows, pc, no_code) -> np.ndarray | None:
        """An arrow text column's complete rows as codes (no_code: arrow's int32 -1, the code of a
        missing name); None when none of them holds a name."""
        if col.null_count == len(col) or not rows.n:
            return None
        chunks = [c for c in pc.dictionary_encode(col).chunks if len(c)]
        if any(not c.dictionary.equals(chunks[0].dictionary) for c in chunks[1:]):  # arrow's usual: one
            chunks = [pc.dictionary_encode(col.combine_chunks())]
        local = [numpy_of(pc.fill_null(c.indices, no_code), np.int32) for c in chunks]
        local = rows.of(local[0] if len(local) == 1 else np.concatenate(local))
        # only the names complete rows hold, numbered in the order those rows hold them (a thread
        # name's own label is no slice's name)
        met = first_met(local)
        if not len(met):
            return None
        names = chunks[0].dictionary.to_pylist()
        table = np.full(len(names) + 1, -1, dtype=np.int32)  # [-1]: a missing name
        table[met] = self.lookup([names[i] for i in met])
        return table[local]

    def values_part(self, values: np.ndarray) -> np.ndarray | None:
        """Decoded values (objects, None or NaN where missing) as codes; None when none holds a name."""
        if not any(values) and values.tolist().count(None) == len(values):  # an arg no event holds: C-level
            return None                                                    # passes ('' and 0 are names)
        local = dict.fromkeys(values, -1)  # the distinct values in the order met, hashed in C; missing: -1
        names = [v for v in local if not (v is None or (isinstance(v, float) and v != v))]
        if not names:
            return None
        local.update(zip(names, self.lookup(names).tolist()))
        return np.fromiter(map(local.__getitem__, values), dtype=np.int32, count=len(values))

    def codes(self, parts: list) -> tuple[np.ndarray, list]:
        """The batches' parts as one int32 code column (-1: missing) and the names the codes number;
        parts are consumed."""
        out = join_parts(parts, np.int32, -1)
        return out, list(self.seen)

    def categorical(self, parts: list) -> pd.Categorical:
        """The batches' parts (codes, or a count of missing values) as one categorical, categories
        sorted as events.labels sorts them; parts are consumed (each freed once copied)."""
        import pandas as pd  # only where the frame is built: the streamed read never imports it

        from partui.analysis.table.events import labels
        total = sum(p if isinstance(p, int) else len(p) for p in parts)
        sorted_as = labels(np.array(list(self.seen), dtype=object))  # each name's place among the sorted
        cats = sorted_as.categories
        kind = code_dtype(len(cats))
        place = np.append(sorted_as.codes.astype(kind), kind(-1))
        out = np.empty(total, dtype=kind)
        at = 0
        while parts:
            part = parts.pop(0)
            n = part if isinstance(part, int) else len(part)
            if isinstance(part, int):
                out[at:at + n] = -1
            else:
                np.take(place, part, out=out[at:at + n])
            at += n
            del part
        return pd.Categorical.from_codes(out, dtype=pd.CategoricalDtype(cats))


def first_met(codes: np.ndarray) -> np.ndarray:
    """The distinct codes >= 0 of an int array, in the order first met (pd.unique's order)."""
    if not len(codes):
        return codes
    # a stable sort puts each code's first place first among its own; int16 codes sort by radix (a
    # dictionary of fewer than 32k names: ~3x faster than np.unique's sort, ~2x pandas' hashing)
    small = codes.astype(np.int16) if codes.max() < 2**15 else codes
    order = np.argsort(small, kind="stable")
    ordered = small[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    met = ordered[starts][np.argsort(order[starts])]
    return met[met >= 0].astype(codes.dtype)


def join_parts(parts: list, dtype, fill) -> np.ndarray:
    """One column of the batches' parts (an int: that many `fill` values); parts consumed."""
    out = np.empty(sum(p if isinstance(p, int) else len(p) for p in parts), dtype=dtype)
    at = 0
    while parts:
        part = parts.pop(0)
        n = part if isinstance(part, int) else len(part)
        out[at:at + n] = fill if isinstance(part, int) else part
        at += n
        del part
    return out


def code_dtype(n: int):
    """The codes' dtype pandas gives n categories (so from_codes keeps the array as made)."""
    return np.int8 if n < 127 else np.int16 if n < 32767 else np.int32 if n < 2**31 - 1 else np.int64


def join_numbers(parts: list) -> np.ndarray:
    """One float column of the batches' parts (an int: that many missing values); parts consumed."""
    if all(isinstance(p, int) for p in parts):
        total = sum(parts)
        parts.clear()
        return missing(total)
    return join_parts(parts, np.float64, np.nan)


def join_ids(parts: list) -> np.ndarray:
    """One pid / tid column: int64 when every part is, else as events.ids reads the values."""
    if not parts:
        return np.zeros(0, dtype=np.int64)
    if all(getattr(p, "dtype", None) == np.int64 for p in parts):
        out = np.concatenate(parts)
    else:
        out = ids(list(np.concatenate([np.asarray(p, dtype=object) for p in parts])))
    parts.clear()
    return out


def release_freed_memory() -> None:
    """Give the decoders' freed buffers back to the system: pyarrow's pool and the C heap keep what a
    read freed (a million-event trace: ~200 MB the analysis would otherwise stand on)."""
    try:  # optional: pyarrow only where installed, malloc_trim only in glibc
        import pyarrow
        pyarrow.default_memory_pool().release_unused()
    except ImportError:
        pass
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
