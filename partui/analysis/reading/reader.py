"""Open a trace file (JSON or gzip'd JSON), tell its format and read it into the analysis table:
partui's own (partui_format) or torch.profiler's (kineto).

A format is one `TraceFormat` record in FORMATS: how to recognise its document, how to read it into
the events table, and how a user records one. Adding a reader is its module plus one record here."""
from __future__ import annotations

import gc
import gzip
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from partui.analysis.reading import trace_cache
from partui.analysis.reading.column_parts import release_freed_memory
from partui.analysis.reading.columns import Columns, arrow_reader
from partui.analysis.gpu.comm_kernels import families
from partui.analysis.table.events import TraceError
from partui.analysis.reading.kineto import is_kineto, kineto_frame, kineto_table
from partui.analysis.reading.partui_format import is_partui, partui_frame, partui_table
from partui.analysis.reading.progress import Progress
from partui.analysis.reading.streamed import decode, read_streamed


@dataclass(frozen=True)
class TraceFormat:
    """One trace format the analysis reads."""
    name: str                                  # df.attrs["format"]
    recognise: Callable[[dict], bool]          # is a decoded document of this format
    read: Callable[[dict, tuple], pd.DataFrame]  # (document, extra comm kernel patterns) -> events
    described: str                             # what marks it, for the unknown-format message
    recorded_by: str                           # how a user records one
    table: Callable | None = None  # (events.slices table, thread names, other keys, patterns) -> events;
    # None: the format is read from the whole document (`read`), not streamed


FORMATS = (
    TraceFormat("partui", is_partui, lambda doc, comm_kernels: partui_frame(doc),
                "partui's metadata.format", "`partui run --trace`", partui_table),
    TraceFormat("kineto", is_kineto, kineto_frame, "torch.profiler's schemaVersion",
                "torch.profiler", kineto_table),
)
FORMAT_OF = {f.name: f for f in FORMATS}


class Shared(dict):
    """A trace's metadata in `df.attrs`, shared by every frame derived from the loaded one: pandas
    deep-copies attrs on each operation, thousands of times in one analysis; this copies as itself."""

    def __deepcopy__(self, memo):
        return self


def read_doc(path: str) -> dict:
    if os.path.isdir(path):
        raise TraceError(f"{path} is a folder: name one trace file in it (.json or .json.gz)")
    if not os.path.isfile(path):
        raise TraceError(f"{path}: no such file or directory")
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        opener = gzip.open if magic == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            raw = f.read()
        return decode(raw)
    except (ValueError, UnicodeDecodeError, EOFError, gzip.BadGzipFile, zlib.error) as exc:  # JSON too
        raise TraceError(f"{path}: not valid JSON, truncated or corrupt ({exc})") from None


def read_table(path: str, comm_kernels=(), progress: Progress | None = None) -> pd.DataFrame:
    """One trace file into the analysis table: streamed when it can be, else decoded whole."""
    if not os.path.isfile(path):
        raise TraceError(f"{path}: no such file or directory")
    size = os.path.getsize(path)
    whole = size < STREAM_MIN or (size < WHOLE_WITHOUT_ARROW and arrow_reader() is None)
    streamed = None if whole else read_streamed(path, progress)
    if streamed is None:
        return frame(read_doc(path), path, comm_kernels)
    head, cols = streamed
    try:
        fmt = detect(head, cols.events)
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None
    if FORMAT_OF[fmt].table is None:
        return frame(read_doc(path), path, comm_kernels)
    return _table(fmt, cols, head, path, comm_kernels)


def _table(fmt: str, cols: Columns, head: dict, path: str, comm_kernels) -> pd.DataFrame:
    try:
        frame = cols.frame()  # a big one gives its parts' memory back as it joins (columns.TRIM_ROWS)
        df = FORMAT_OF[fmt].table(frame, cols.names, head, comm_kernels)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise TraceError(f"{path or 'trace'}: its events do not read as a {fmt} trace "
                         f"({type(exc).__name__}: {exc}); record it again (partui run --trace PATH)") from None
    set_attrs(df, fmt, path, head, comm_kernels)
    return df


def set_attrs(df: pd.DataFrame, fmt: str, path: str, doc: dict, comm_kernels) -> None:
    df.attrs.update(format=fmt, path=path, metadata=Shared(doc.get("metadata") or {}),
                    comm_kernels=tuple(comm_kernels),
                    world_size=int((doc.get("distributedInfo") or {}).get("world_size") or 1))


def rank_file(path: str) -> tuple[dict, Columns]:
    """One rank's torch.profiler trace: its other keys and its events' columns."""
    streamed = read_streamed(path)
    if streamed is None:
        doc = read_doc(path)
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            return doc, None
        cols = Columns(decode, use_arrow=False)
        try:
            cols.add_events(doc["traceEvents"])
        except TypeError:  # an event that is not an object: the table's reader says so
            cols = None
        return doc, cols
    return streamed


def load_rank_files(folder: str, comm_kernels=(), progress: Progress | None = None) -> pd.DataFrame:
    """Every *.json / *.json.gz in `folder`, each one rank's torch.profiler trace (its rank from
    distributedInfo.rank, else its place in name order), as one table; files are read in
    parallel (pyarrow's decoder runs outside the GIL), their checks made in name order."""
    names = sorted(n for n in os.listdir(folder) if n.endswith(TRACE_SUFFIXES))
    if not names:
        raise TraceError(f"{folder}: no .json or .json.gz traces in this directory; pass a trace "
                         f"file or a directory of per-rank torch.profiler traces")
    frames, seen, worlds = [], {}, {}
    with ThreadPoolExecutor(max_workers=max(min(os.cpu_count() or 1, 4, len(names)), 1)) as pool:
        read = pool.map(rank_file, [os.path.join(folder, n) for n in names])
        for i, (name, (doc, cols)) in enumerate(zip(names, read)):
            path = os.path.join(folder, name)
            if not isinstance(doc, dict) or not is_kineto(doc) or cols is None:
                raise TraceError(f"{path}: not a torch.profiler trace; a directory holds one "
                                 f"torch.profiler trace per rank (partui traces are single files)")
            info = doc.get("distributedInfo") or {}
            doc["distributedInfo"] = dict(info, rank=int(info.get("rank", i)))
            world = int(info.get("world_size", len(names)))
            other = next((n for n, w in worlds.items() if w != world), None)
            if other is not None:
                raise TraceError(f"{path}: distributedInfo.world_size {world}, but {other} says {worlds[other]}: "
                                 f"the directory mixes traces of different jobs; keep one job's ranks in it")
            worlds[name] = world
            rank = doc["distributedInfo"]["rank"]
            if rank in seen:
                raise TraceError(f"{path}: rank {rank} again (also {seen[rank]}); keep one trace per "
                                 f"rank in the directory")
            seen[rank] = name
            frames.append(_table("kineto", cols, doc, path, comm_kernels))
            if progress:
                progress.show(f"{i + 1} of {len(names)} rank files read")
    df = pd.concat(frames, ignore_index=True).sort_values(["rank", "ts"], kind="stable")
    df = df.reset_index(drop=True)
    df.attrs.update(format="kineto", path=folder, metadata=Shared(ranks=sorted(seen)),
                    comm_kernels=tuple(comm_kernels), world_size=max(worlds.values()))
    # a figure no rank's trace records (wait, bytes) stays unrecorded for the folder: '-' / null
    unrecorded = set.intersection(*(set(f.attrs.get("unrecorded", ())) for f in frames))
    if unrecorded:
        df.attrs["unrecorded"] = tuple(sorted(unrecorded))
    return df


def detect(doc, n_events: int | None = None) -> str:
    """The name of the document's format (FORMATS), or raise TraceError naming what is missing;
    n_events: how many events a streamed read saw (its doc holds only the last few)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError("not a Chrome trace (expected a JSON object with a 'traceEvents' list)")
    fmt = next((f.name for f in FORMATS if f.recognise(doc)), None)
    if fmt is None:
        raise TraceError(f"unknown trace format (neither {' nor '.join(f.described for f in FORMATS)}); "
                         f"record it with {' or '.join(f.recorded_by for f in FORMATS)}")
    events = doc["traceEvents"]
    if not (len(events) if n_events is None else n_events):
        raise TraceError("the trace holds no events: record at least one step "
                         "(partui run --trace PATH --steps 2)")
    odd = None if set(map(type, events)) == {dict} else next(  # one C-level pass when all is well
        (i for i, e in enumerate(events) if not isinstance(e, dict)), None)
    if odd is not None:
        raise TraceError(f"event {odd} is {type(events[odd]).__name__} {events[odd]!r:.40}, not a "
                         f"JSON object: the file is not a Chrome trace; record it again")
    return fmt


def frame(doc: dict, path: str = "", comm_kernels=()) -> pd.DataFrame:
    """The analysis table of an already decoded trace document (a bench's in-memory trace);
    comm_kernels: extra comm kernel name patterns for torch.profiler GPU traces (comm_kernels.py)."""
    try:
        fmt = detect(doc)
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}" if path else str(exc)) from None
    try:
        df = FORMAT_OF[fmt].read(doc, comm_kernels)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise TraceError(f"{path or 'trace'}: its events do not read as a {fmt} trace "
                         f"({type(exc).__name__}: {exc}); record it again (partui run --trace PATH)") from None
    set_attrs(df, fmt, path, doc, comm_kernels)
    return df


TRACE_SUFFIXES = (".json", ".json.gz")
# a file under STREAM_MIN is decoded whole: its dicts fit in memory, and one decode of a small file
# is as quick as batches. Past it, batches (with pyarrow) win: DeepSeek's trace repeated 25 times
# (62 MB) loads streamed in ~0.95x the CPU of one whole decode, at 270 MB peak RSS against 640 MB for
# the whole report. Without pyarrow, batches of dicts cost ~1.6x the CPU of one whole decode (the
# million-event bench trace), so only files past WHOLE_WITHOUT_ARROW stream
STREAM_MIN = 32 << 20
WHOLE_WITHOUT_ARROW = 512 << 20


def load(path: str, comm_kernels=(), progress: bool | None = False) -> pd.DataFrame:
    """Events of a partui or torch.profiler trace; `df.attrs` holds format and metadata. A
    directory of per-rank torch.profiler traces (HTA's input) is read as one multi-rank trace.
    comm_kernels: regexes naming more GPU comm kernels (beside comm_kernels.FAMILIES).
    progress: a line on stderr while a long read runs: None shows it when stderr is a terminal (the
    CLI's table output), False never (the default: the app's screen, `--format json`, library
    callers). A trace read before opens from its cache (trace_cache)."""
    comm_kernels = tuple(comm_kernels or ())
    families(comm_kernels)  # a bad pattern fails here, before the file is read
    folder = os.path.isdir(path)
    files = ([os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(TRACE_SUFFIXES)]
             if folder else [path] if os.path.isfile(path) else [])
    caching = bool(files) and trace_cache.enabled(files)
    cached = trace_cache.get(path, files, comm_kernels) if caching else None
    if cached is not None:
        cached.attrs.update(path=path, metadata=Shared(cached.attrs.get("metadata") or {}),
                            comm_kernels=comm_kernels)
        release_freed_memory()
        return cached
    shown = Progress(f"reading {os.path.basename(os.path.normpath(path))}", progress)
    was_enabled = gc.isenabled()
    gc.disable()  # millions of new event dicts would trigger the cyclic GC over and over
    try:
        df = load_rank_files(path, comm_kernels, shown) if folder else read_table(path, comm_kernels, shown)
    finally:
        shown.done()
        if was_enabled:
            gc.enable()
    if caching:
        trace_cache.put(path, files, comm_kernels, df)
    release_freed_memory()
    return df
