"""A batch of trace events into columns, and batches into the slices table of events.slices.

A batch is decoded by pyarrow's JSON reader straight into typed columns, in C++, when pyarrow is
installed and the batch fits the schema (ints where partui and torch.profiler write ints, floats,
strings), one event a line (event_lines); the few events arrow cannot type (a text pid, such as
torch.profiler's "Spans") are cut out and decoded alone (once a trace has shown one, each later
batch is split around them before arrow reads it), and any other batch it refuses is decoded by
orjson / json into dicts and read as events.slices reads a document. Either way each batch leaves
only its complete ('X') events' columns, as numpy parts this process owns (column_parts: text as
codes), and its thread names: memory grows with the rows kept, not the bytes read. `Columns.frame`
then joins the parts a column at a time into the same table, with the same dtypes and category
order, as events.slices of the whole document.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from partui.analysis.reading.column_parts import Names, Rows, id_part, join_ids, join_numbers, number_part, \
    release_freed_memory
from partui.analysis.table.event_columns import ARG_KEYS, TEXT_ARGS, TOP_FIELDS, is_missing, slice_columns, thread_names
from partui.analysis.reading.json_stream import BETWEEN

if TYPE_CHECKING:
    import pandas as pd

FIELDS = tuple(TOP_FIELDS) + tuple(ARG_KEYS)
TEXT_ID = re.compile(rb'"[pt]id"\s*:\s*"')  # an event whose pid or tid is text, which arrow cannot type
SPLIT_MIN = 1 << 20  # a refused batch is halved down to about this size (bytes)
NUMBER_ARGS = tuple(k for k in ARG_KEYS if k not in TEXT_ARGS)
TEXT_COLUMNS = ("name", "cat") + TEXT_ARGS
# from this many rows, Columns.frame gives freed memory back between columns: a column is then 32 MB
# or more, and without it the parts' heap and the joined columns are held together (a 3 GB trace's
# join: 1.58 GB peak, 0.63 GB with it); below, the ~20 malloc_trims cost more time (~70 ms on 2M
# rows) than the few MB they save
TRIM_ROWS = 4 << 20


class Arrow(NamedTuple):
    """pyarrow's modules, the events' parse options, and the constants the reader compares with."""
    pa: object
    pj: object
    pc: object
    options: object
    meta: object  # "M"
    complete: object  # "X"
    thread_name: object
    false: object
    no_code: object  # int32 -1: a missing name's code


def arrow_reader(fields=None) -> Arrow | None:
    """pyarrow and the events' schema, or None without pyarrow. fields: the args to type (ARG_KEYS among
    them; default all): a reader that keeps a few skips the rest as arrow skips any unknown key (a
    torch.profiler trace's args with only correlation typed: ~25% less parse time)."""
    try:  # optional: the C++ decoder (pyproject's `fast` extra); without it, dicts
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pj
    except ImportError:
        return None
    fields = FIELDS if fields is None else fields
    args = pa.struct([(k, pa.float64()) for k in NUMBER_ARGS if k in fields]
                     + [(k, pa.string()) for k in TEXT_ARGS if k in fields]
                     + [("name", pa.string())])  # name: a thread_name metadata event's
    schema = pa.schema([("ph", pa.string()), ("name", pa.string()), ("cat", pa.string()),
                        ("pid", pa.int64()), ("tid", pa.int64()), ("ts", pa.float64()),
                        ("dur", pa.float64()), ("args", args)])
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore",
                              newlines_in_values=False)  # one event a line (event_lines): arrow cuts
    # its blocks at line breaks instead of parsing to find each event's end
    return Arrow(pa, pj, pc, options, arrow_scalar(pa, b"M"), arrow_scalar(pa, b"X"),
                 arrow_scalar(pa, b"thread_name"), arrow_scalar(pa, np.zeros(1, np.uint8), pa.bool_()),
                 arrow_scalar(pa, np.full(1, -1, np.int32), pa.int32()))


def arrow_scalar(pa, value, kind=None):
    """An arrow scalar built from its bytes (text), or from a one-value numpy array's buffer. Why not
    pa.scalar: converting any Python or numpy value, pyarrow imports pandas first (~0.6 s) to ask
    whether it is a pandas object; its own buffers it takes as they are."""
    if kind is None:  # text: offsets [0, len] and the bytes
        return pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(np.array([0, len(value)], np.int32)),
                                                      pa.py_buffer(value)])[0]
    return pa.Array.from_buffers(kind, 1, [None, pa.py_buffer(value)])[0]


class Columns:
    """The complete events' columns of the batches read so far, and their thread names. fields: the
    columns kept (default every one, FIELDS, which frame() needs; the top fields always)."""

    def __init__(self, decode, use_arrow: bool = True, fields=FIELDS):
        self.decode = decode
        self.fields = tuple(TOP_FIELDS) + tuple(k for k in ARG_KEYS if k in fields)
        self.arrow = arrow_reader(self.fields) if use_arrow else None
        self.chunks: dict[str, list] = {k: [] for k in self.fields}
        self.names: dict = {}
        self.text = {k: Names() for k in TEXT_COLUMNS}  # each text column's names, first met first
        self.events = 0  # every event, of any phase (an empty trace is refused)
        self.text_ids = False  # a batch held events with a text pid or tid (see _arrow_parts)
        self.batches = {"arrow": 0, "dicts": 0}  # how each batch was decoded (the tests check)

    def add_text(self, text: bytes) -> bool:
        """One batch of comma-separated events; False when it is not whole events (a false cut)."""
        parts = self._decoded(text)
        if parts is None:
            return False
        while parts:  # all decoded before any is kept: a failed batch leaves nothing
            arrow, part = parts.pop(0)  # each arrow table dropped once copied out (column_parts)
            if arrow:
                self._add_table(part)
            else:
                self.add_events(part)
            del part
        return True

    def _decoded(self, text: bytes) -> list | None:
        """[(True, an arrow table) or (False, event dicts), ...] of the batch, in order: arrow's
        table, or its runs around the few events with a text pid (_arrow_parts); a batch arrow
        refuses for another reason is halved, down to SPLIT_MIN, so only the pieces holding such
        events take the slower dicts; None: not whole events."""
        if self.arrow is not None:
            parts = self._arrow_parts(text)
            if parts is not None:
                return parts
            middle = BETWEEN.search(text, len(text) // 2) if len(text) > SPLIT_MIN else None
            if middle is not None:
                first = self._decoded(text[:middle.start() + 1])
                second = self._decoded(text[middle.end() - 1:]) if first is not None else None
                if second is not None:
                    return first + second
        try:  # a false cut at the middle: the whole batch as one
            return [(False, self.decode(b"[" + text + b"]"))]
        except ValueError:
            return None

    def add_events(self, events: list) -> None:
        """Decoded event dicts (a batch pyarrow could not type, or the events after the last cut)."""
        if set(map(type, events)) - {dict}:
            raise TypeError("an event that is not a JSON object")  # the whole-file read names it
        self.events += len(events)
        self.batches["dicts"] += 1
        self.names.update(thread_names(events))
        part = slice_columns(events)
        n = len(part["ts"])
        for key in self.chunks:
            values = part.pop(key)
            if key in TEXT_COLUMNS:
                values = self.text[key].values_part(values)
            elif key not in ("pid", "tid") and is_missing(values):
                values = None
            self.chunks[key].append(n if values is None else values)

    def _arrow_parts(self, text: bytes) -> list | None:
        """[(True, the batch's arrow table)]; or, where arrow refuses it for events with a text pid
        or tid (torch.profiler's "Spans" / "Traces" rows, a few per trace), the runs of events
        between those as tables and those alone as dicts, in file order; None: arrow refuses it.
        Once a batch held such events, each later one is searched for them before arrow reads it:
        a refused read costs up to a whole parse (a trace tiled from copies holds them in every batch)."""
        flat, gap = event_lines(text)
        lines = flat.replace(gap, b"}\n{")
        if self.text_ids:
            parts = self._around_text_ids(lines, written_text_ids(lines))
            if parts is not None:
                return parts
        table = self._read_lines(lines)
        if table is None and BETWEEN.search(lines) is not None:  # gaps of more than one form: each
            lines = BETWEEN.sub(b"}\n{", flat)                    # found by the regex
            table = self._read_lines(lines)
        if table is not None:
            return [(True, table)]
        parts = None if self.text_ids else self._around_text_ids(lines, written_text_ids(lines))  # ~2x faster
        if parts is None:  # a text id written another way: the regex finds it
            parts = self._around_text_ids(lines, (hit.start() for hit in TEXT_ID.finditer(lines)))
        self.text_ids = self.text_ids or parts is not None
        return parts

    def _read_lines(self, lines):
        """Arrow's table of one-event-a-line text (bytes or an arrow buffer), or None where it refuses it."""
        pa, pj, pc, options = self.arrow[:4]
        read = pj.ReadOptions(block_size=min(max(len(lines) // 8, 1 << 20), 8 << 20))
        try:
            table = pj.read_json(pa.BufferReader(lines), parse_options=options, read_options=read)  # zero-copy
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        meta = table.filter(pc.equal(table.column("ph"), self.arrow.meta))
        if meta.num_rows and pc.any(pc.and_(pc.equal(meta.column("name"), self.arrow.thread_name),
                                            pc.is_null(meta.column("args")))).as_py():
            return None  # a thread_name without args: the dict reader says what it does
        return table

    def _around_text_ids(self, lines: bytes, hits) -> list | None:
        """The lines holding a text pid or tid (hits: where each such key starts, in order) decoded
        as dicts, the runs between them by arrow (read in place: slices of one arrow buffer over the
        lines, no copies); None: no such line, or arrow refuses a run."""
        parts, pos = [], 0
        whole = self.arrow.pa.py_buffer(lines)
        for hit in hits:
            first = lines.rfind(b"\n", 0, hit) + 1
            if first < pos:
                continue  # a second text id of the same line
            last = lines.find(b"\n", hit)
            last = len(lines) if last < 0 else last
            run = self._read_lines(whole.slice(pos, first - 1 - pos)) if first > pos else True
            if run is None:
                return None
            if run is not True:
                parts.append((True, run))
            try:
                parts.append((False, self.decode(b"[" + lines[first:last] + b"]")))
            except ValueError:  # not one event a line (a gap inside a string): halve the batch
                return None
            pos = last + 1
        rest = self._read_lines(whole.slice(pos)) if parts and pos < len(lines) else True
        if not parts or rest is None:
            return None
        return parts + ([(True, rest)] if rest is not True else [])

    def _add_table(self, table) -> None:
        """One arrow batch into owned parts (column_parts): the table itself is dropped by the caller."""
        arrow = self.arrow
        pc = arrow.pc
        ph = table.column("ph")
        meta = table.filter(pc.and_(pc.equal(ph, arrow.meta), pc.equal(table.column("name"), arrow.thread_name)))
        if meta.num_rows:
            label = pc.struct_field(meta.column("args"), "name").to_pylist()
            self.names.update(zip(zip(meta.column("pid").to_pylist(), meta.column("tid").to_pylist()), label))
        rows = Rows(pc.fill_null(pc.equal(ph, arrow.complete), arrow.false))
        args = table.column("args")
        for key in self.fields:
            col = table.column(key) if key in TOP_FIELDS else pc.struct_field(args, key)
            part = (self.text[key].arrow_part(col, rows, pc, arrow.no_code) if key in TEXT_COLUMNS
                    else id_part(col, rows) if key in ("pid", "tid") else number_part(col, rows))
            # a key no complete event of the batch holds (most of ARG_KEYS in a torch.profiler trace):
            # only its count, the missing values made once at the join
            self.chunks[key].append(rows.n if part is None else part)
        self.events += table.num_rows
        self.batches["arrow"] += 1

    def rows(self) -> int:
        """How many complete events the batches held."""
        return sum(p if isinstance(p, int) else len(p) for p in self.chunks["ts"])

    def frame(self) -> pd.DataFrame:
        """The slices table (events.slices' columns, dtypes and category order) of every batch,
        joined a column at a time; past TRIM_ROWS rows the memory a column's parts held is given
        back before the next one is built."""
        from partui.analysis.table.events import table  # pandas: only where the frame is built
        if self.fields != FIELDS:
            raise ValueError(f"a frame needs every column; these columns keep {', '.join(self.fields)}")
        rows = self.rows()
        joined = {}
        for key in FIELDS:
            parts = self.chunks.pop(key)
            joined[key] = (self.text[key].categorical(parts) if key in TEXT_COLUMNS
                           else join_ids(parts) if key in ("pid", "tid") else join_numbers(parts))
            if rows >= TRIM_ROWS:
                release_freed_memory()
        self.chunks = {k: [] for k in self.fields}
        self.text = {k: Names() for k in TEXT_COLUMNS}
        return table(joined)

    def column(self, key: str) -> tuple[np.ndarray, list] | np.ndarray:
        """One column of every batch, joined once (its parts consumed; a second ask is a KeyError):
        a text column as (int32 codes, -1 where missing; the names they number, first met first),
        pid / tid as join_ids gives them, a number column as float64 (NaN where missing)."""
        if key not in self.chunks:
            raise KeyError(f"{key!r}: not a column of the streamed events, or already taken "
                           f"(each is joined once); columns: {', '.join(self.fields)}")
        parts = self.chunks.pop(key)
        if key in TEXT_COLUMNS:
            return self.text.pop(key).codes(parts)
        return join_ids(parts) if key in ("pid", "tid") else join_numbers(parts)


def written_text_ids(lines: bytes) -> list:
    """Where a text pid or tid starts, as torch.profiler writes one (compact or pretty-printed):
    found by bytes.find, ~2x faster than TEXT_ID's scan, whose first character is every key's
    quote. A text id written another way is missed here: arrow then refuses its run, and the
    caller reads the batch the slower, exact way."""
    hits = []
    for written in (b'id":"', b'id": "'):
        at = lines.find(written)
        while at >= 0:
            if TEXT_ID.match(lines, at - 2):  # the key is "pid" or "tid", not another id
                hits.append(at - 2)
            at = lines.find(written, at + len(written))
    return sorted(hits)


def event_lines(text: bytes) -> tuple[bytes, bytes]:
    """The batch without line breaks, and the gap between its first two events as written there
    (compact: `},{`; torch.profiler's pretty-printed `},\n  {`: `},  {`). A raw line break in JSON is
    only ever white space (a string holds none), so removing them changes no value; the caller
    turns each gap into one, so arrow reads one event a line. A gap met inside a string, or a batch
    whose gaps differ, leaves a line that is not one event: arrow refuses it, never misreads it."""
    flat = text.translate(None, b"\r\n") if b"\n" in text or b"\r" in text else text  # compact: as is
    first = BETWEEN.search(flat)
    return flat, (flat[first.start():first.end()] if first else b"},{")
