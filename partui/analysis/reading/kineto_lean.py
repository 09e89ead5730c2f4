"""A torch.profiler GPU trace read straight into gpu_kernels' and pair_parts' arrays, without pandas: what
`partui report TRACE` (by rank, by pair) prints on such a trace is computed from these (commands/report_lean),
without the half second that importing pandas alone takes. The reading is kineto_kinds' (the one the
analysis table's reader calls too), the rows the table's own: complete ('X') events with a time, in (rank,
ts) order, a directory's files (one rank each) in name order. A file of WHOLE_MAX bytes or more is read
batch by batch (analysis/streamed, the table's own streamed reader), a smaller one decoded whole.

What this reader does not serve raises NotLean, and the report reads the trace as a frame instead (the
same figures; every refusal and message is that path's): a partui trace, a CPU-only torch.profiler trace,
events that are not plain (a non-text name, an event that is not an object), a directory whose files
disagree (their ranks, their world size), a bad --comm-kernels pattern.
"""
from __future__ import annotations

import gc
import gzip
import os
import zlib
from itertools import compress, repeat

import numpy as np

from partui.analysis.gpu.comm_families import PatternError, family_names
from partui.analysis.table.event_columns import ids
from partui.analysis.reading.kineto_arrays import GpuTrace, NotLean, Tables, file_rows, gpu_trace
from partui.analysis.gpu.kineto_kinds import GPU_CATS, launch_times
from partui.analysis.gpu.pair_parts import PairsRead, is_part_name, read_pairs
from partui.analysis.reading.progress import Progress
from partui.analysis.reading.streamed import decode as streamed_decode
from partui.analysis.reading.streamed import stream_events

WHOLE_MAX = 32 << 20   # bytes on disk: a file this big or bigger is streamed (as the frame reader: reader.STREAM_MIN)
KINETO_KEYS = (b'"schemaVersion"', b'"distributedInfo"', b'"deviceProperties"')   # kineto.is_kineto's
GPU_CAT_TEXT = (b'"kernel"', b'"gpu_memcpy"', b'"gpu_memset"')
EMPTY: dict = {}   # the args of an event without any (never written to)
LEAN_FIELDS = ("correlation",)   # the one arg this reader reads (beside every event's own fields)


def lean_pairs(trace: GpuTrace) -> PairsRead:
    """pair_parts.read_pairs of a trace read here: its user annotations and counted kernels, each kernel's
    launch from the CPU calls carrying its correlation id (kineto_kinds.launch_times, as the table's reader)."""
    k, h = trace.kernels, trace.hta   # hta's cpu_*: the CPU calls carrying a correlation id
    launch = launch_times(h["cpu_rank"], h["cpu_corr"], h["cpu_ts"], k.rank, k.corr)
    return read_pairs(trace.annotations, k.rank, k.ts, k.end, k.comm, launch)


def has_parts(trace: GpuTrace) -> bool:
    """Whether the trace has part annotations (then --by pair reads them; pair_parts.is_part_name)."""
    return any(is_part_name(n) for n in set(trace.annotations.name))


def read_gpu_trace(path: str, comm_kernels=(), progress: bool | None = False) -> GpuTrace:
    """The trace at path (a file, or a directory of per-rank files) as a GpuTrace; NotLean where the
    frame reader should read it instead. progress: as reader.load's (None: a line on a terminal). The
    cyclic GC is off meanwhile: the decoded events are tens of thousands of new dicts, each collection
    would walk them all again (the frame reader does the same)."""
    was_enabled = gc.isenabled()
    gc.disable()
    shown = Progress(f"reading {os.path.basename(os.path.normpath(path))}", progress)
    try:
        return read_files(path, comm_kernels, shown)
    finally:
        shown.done()
        if was_enabled:
            gc.enable()


def read_files(path: str, comm_kernels, shown: Progress) -> GpuTrace:
    """read_gpu_trace, the GC aside."""
    try:
        family_names([], comm_kernels)
    except PatternError:
        raise NotLean("a bad --comm-kernels pattern: the frame path names it") from None
    tables = Tables(comm_kernels)
    if os.path.isdir(path):
        files = sorted(n for n in os.listdir(path) if n.endswith((".json", ".json.gz")))
        if not files:
            raise NotLean("no trace files")
        found, worlds = [], set()
        for i, n in enumerate(files):   # each file classified as read: its other events dropped at once
            events = rank_events(os.path.join(path, n), i, len(files), shown)
            worlds.add(events["world"])
            found.append(file_rows(events, tables))
            shown.show(f"{i + 1} of {len(files)} rank files read")
        if len({f["rank"] for f in found}) < len(found) or len(worlds) > 1:
            raise NotLean("files of one rank twice, or of different jobs: the frame path names them")
        world = max(worlds)
    elif os.path.isfile(path):
        events = rank_events(path, None, 1, shown)
        world = events["world"]
        found = [file_rows(events, tables)]
    else:
        raise NotLean("no such file")
    del events
    return gpu_trace(found, tables, world, path)


def rank_events(path: str, place: int | None, n_files: int, progress=None) -> dict:
    """One torch.profiler file's complete events as columns (name and category as (codes, their distinct
    values)), its rank (distributedInfo, else its place in a directory), world size and threads: a file of
    WHOLE_MAX bytes or more streamed (streamed_events), a smaller one decoded whole."""
    if os.path.getsize(path) >= WHOLE_MAX:
        return streamed_events(path, place, n_files, progress)
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, ValueError, zlib.error):
            raise NotLean("not gzip: the frame path names it") from None
    # a partui or CPU-only trace is told by its bytes, before any decoding
    if not any(k in raw for k in KINETO_KEYS) or not any(c in raw for c in GPU_CAT_TEXT):
        raise NotLean("not a torch.profiler GPU trace")
    doc = decode(raw)
    del raw
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list) or not events or doc.get("metadata") is not None \
            or not any(k.strip(b'"').decode() in doc for k in KINETO_KEYS):
        raise NotLean("not a plain torch.profiler trace")
    try:
        ph = list(map(dict.get, events, repeat("ph")))   # TypeError: an event that is not an object
        rank, world = rank_of(doc, place, n_files)
        threads = {(e.get("pid"), e.get("tid")): e["args"]["name"] for e in compress(events, [p == "M" for p in ph])
                   if e.get("name") == "thread_name" and "args" in e}
        # one pass over the complete events' dicts (each visited once: they lie all over the heap)
        rows = [(e.get("name"), e.get("cat"), e.get("ts"), e.get("dur"), e.get("pid"), e.get("tid"),
                 (e.get("args") or EMPTY).get("correlation")) for e in compress(events, [p == "X" for p in ph])]
    except (TypeError, ValueError, KeyError, AttributeError):
        raise NotLean("odd events or metadata: the frame path names them") from None
    del events, doc, ph
    if not rows:
        raise NotLean("no complete events")
    name, cat, ts, dur, pid, tid, corr = zip(*rows)
    del rows
    if set(map(type, name)) | set(map(type, cat)) != {str}:
        raise NotLean("a name or category that is not text")
    try:
        ts, dur, corr = (np.array(v, dtype=float) for v in (ts, dur, corr))
    except (TypeError, ValueError):
        raise NotLean("a time that is not a number") from None
    keep = ~np.isnan(ts)
    dur = np.nan_to_num(dur, nan=0.0)
    return {"rank": rank, "world": world, "threads": threads, "keep": keep, "name": local_codes(name),
            "cat": local_codes(cat), "pid": ids(pid), "tid": ids(tid), "ts": ts, "end": ts + dur,
            "dur": dur, "corr": corr}


def rank_of(head: dict, place: int | None, n_files: int) -> tuple[int, int]:
    """(rank, world size) from distributedInfo: a directory's file without one takes its place and the
    directory's count (as the table's reader)."""
    info = head.get("distributedInfo") or {}
    rank = int(info.get("rank", 0 if place is None else place))
    world = int(info.get("world_size") or 1) if place is None else int(info.get("world_size", n_files))
    return rank, world


def streamed_events(path: str, place: int | None, n_files: int, progress=None) -> dict:
    """rank_events of a big file: read batch by batch into columns (analysis/streamed, pyarrow's JSON reader
    where installed), never held as dicts; the same checks as the whole read."""
    got = stream_events(path, progress, fields=LEAN_FIELDS)
    if got is None:
        raise NotLean("not laid out for streaming: the frame path reads it whole")
    head = got.head
    if not isinstance(head, dict) or head.get("metadata") is not None or not got.events \
            or not any(k.strip(b'"').decode() in head for k in KINETO_KEYS):
        raise NotLean("not a plain torch.profiler trace")
    name, cat = got.text("name"), got.text("cat")
    if (name[0] < 0).any() or (cat[0] < 0).any() or set(map(type, name[1] + cat[1])) - {str}:
        raise NotLean("a name or category that is not text")
    if not any(c.lower() in GPU_CATS for c in cat[1]):
        raise NotLean("not a torch.profiler GPU trace")
    try:
        rank, world = rank_of(head, place, n_files)
    except (TypeError, ValueError, AttributeError):
        raise NotLean("odd metadata: the frame path names it") from None
    ts, dur = got.numbers("ts"), np.nan_to_num(got.numbers("dur"), nan=0.0)
    if not len(ts):
        raise NotLean("no complete events")
    return {"rank": rank, "world": world, "threads": got.threads, "keep": ~np.isnan(ts), "name": name, "cat": cat,
            "pid": got.ids("pid"), "tid": got.ids("tid"), "ts": ts, "end": ts + dur, "dur": dur,
            "corr": got.numbers("correlation")}


def decode(raw: bytes):
    """The document, decoded as the frame reader decodes it (streamed.decode: orjson where installed)."""
    try:
        return streamed_decode(raw)
    except (ValueError, UnicodeDecodeError):
        raise NotLean("not JSON: the frame path names it") from None


def codes(values: list, table: dict) -> np.ndarray:
    """Each value's code in table (value -> code, grown as new values come)."""
    for v in dict.fromkeys(values):   # the distinct values, a few thousand: each coded once
        table.setdefault(v, len(table))
    return np.array(list(map(table.__getitem__, values)), dtype=np.int64)


def local_codes(values) -> tuple[np.ndarray, list]:
    """(each value's code, the distinct values in the order first met): a file's text column."""
    table: dict = {}
    got = codes(values, table)
    return got, list(table)
