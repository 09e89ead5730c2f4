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

import numpy as np
import pandas as pd

from partui.analysis.events import ids, labels, missing


class Rows:
    """Which rows of a batch are complete ('X') events; `of(values)`: those rows of a column, as
    an array this process owns (never a view of arrow's buffers)."""

    def __init__(self, is_x):  # is_x: arrow booleans (a ChunkedArray), no nulls
        self.arrow = is_x
        self.mask = is_x.to_numpy()
        self.every = bool(self.mask.all())
        self.n = int(self.mask.sum())

    def of(self, values: np.ndarray) -> np.ndarray:
        return owned(values) if self.every else values[self.mask]


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
    values = rows.of(col.to_numpy(zero_copy_only=False).astype(float, copy=False))
    return None if col.null_count and np.isnan(values).all() else values


def id_part(col, rows: Rows) -> np.ndarray:
    """pids / tids of the complete rows: int64, or objects (None where missing) as events.ids reads them."""
    if col.null_count:
        picked = col.filter(rows.arrow)
        return np.array(picked.to_pylist(), dtype=object) if picked.null_count else owned(picked.to_numpy())
    return rows.of(col.to_numpy())


class Names:
    """One text column's names, numbered in the order first met; batches hold their codes."""

    def __init__(self):
        self.seen: dict = {}

    def lookup(self, values) -> np.ndarray:
        """Each value's code (new ones numbered on, in the order given)."""
        seen = self.seen
        return np.array([seen.setdefault(v, len(seen)) for v in values], dtype=np.int32)

    def arrow_part(self, col, rows: Rows, pc) -> np.ndarray | None:
        """An arrow text column's complete rows as codes; None when none of them holds a name."""
        if col.null_count == len(col) or not rows.n:
            return None
        chunks = [c for c in pc.dictionary_encode(col).chunks if len(c)]
        if any(not c.dictionary.equals(chunks[0].dictionary) for c in chunks[1:]):  # arrow's usual: one
            chunks = [pc.dictionary_encode(col.combine_chunks())]
        local = [c.indices.fill_null(-1).to_numpy() for c in chunks]
        local = rows.of(local[0] if len(local) == 1 else np.concatenate(local))
        # only the names complete rows hold, numbered in the order those rows hold them (a thread
        # name's own label is no slice's name)
        met = pd.unique(local)
        met = met[met >= 0]
        if not len(met):
            return None
        names = chunks[0].dictionary.to_pylist()
        table = np.full(len(names) + 1, -1, dtype=np.int32)  # [-1]: a missing name
        table[met] = self.lookup([names[i] for i in met])
        return table[local]

    def values_part(self, values: np.ndarray) -> np.ndarray | None:
        """Decoded values (objects, None where missing) as codes; None when none holds a name."""
        codes, uniques = pd.factorize(values)  # None -> -1; in the order met, as self.seen numbers them
        if not len(uniques):
            return None
        return np.append(self.lookup(uniques), np.int32(-1))[codes]

    def categorical(self, parts: list) -> pd.Categorical:
        """The batches' parts (codes, or a count of missing values) as one categorical, categories
        sorted as events.labels sorts them; parts are consumed (each freed once copied)."""
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


def code_dtype(n: int):
    """The codes' dtype pandas gives n categories (so from_codes keeps the array as made)."""
    return np.int8 if n < 127 else np.int16 if n < 32767 else np.int32 if n < 2**31 - 1 else np.int64


def join_numbers(parts: list) -> np.ndarray:
    """One float column of the batches' parts (an int: that many missing values); parts consumed."""
    if all(isinstance(p, int) for p in parts):
        return missing(sum(parts))
    out = np.empty(sum(p if isinstance(p, int) else len(p) for p in parts))
    at = 0
    while parts:
        part = parts.pop(0)
        n = part if isinstance(part, int) else len(part)
        out[at:at + n] = np.nan if isinstance(part, int) else part
        at += n
        del part
    return out


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
