"""Open a trace file (JSON or gzip'd JSON), tell its format and read it into the analysis table:
partui's own (partui_format) or torch.profiler's (kineto).

A format is one `TraceFormat` record in FORMATS: how to recognise its document, how to read it into
the events table, and how a user records one. Adding a reader is its module plus one record here."""
from __future__ import annotations

import gc
import gzip
import json
import os
import zlib
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from partui.analysis.comm_kernels import families
from partui.analysis.events import TraceError
from partui.analysis.kineto import is_kineto, kineto_frame
from partui.analysis.partui_format import is_partui, partui_frame


@dataclass(frozen=True)
class TraceFormat:
    """One trace format the analysis reads."""
    name: str                                  # df.attrs["format"]
    recognise: Callable[[dict], bool]          # is a decoded document of this format
    read: Callable[[dict, tuple], pd.DataFrame]  # (document, extra comm kernel patterns) -> events
    described: str                             # what marks it, for the unknown-format message
    recorded_by: str                           # how a user records one


FORMATS = (
    TraceFormat("partui", is_partui, lambda doc, comm_kernels: partui_frame(doc),
                "partui's metadata.format", "`partui run --trace`"),
    TraceFormat("kineto", is_kineto, kineto_frame, "torch.profiler's schemaVersion",
                "torch.profiler"),
)
FORMAT_OF = {f.name: f for f in FORMATS}


class Shared(dict):
    """A trace's metadata in `df.attrs`, shared by every frame derived from the loaded one: pandas
    deep-copies attrs on each operation, thousands of times in one analysis; this copies as itself."""

    def __deepcopy__(self, memo):
        return self


def decode(raw: bytes):
    """orjson when installed (a million-event trace decodes ~1.6x faster than with json)."""
    try:  # optional: a faster JSON decoder, when installed
        import orjson
    except ImportError:
        return json.loads(raw)
    return orjson.loads(raw)


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


def load_rank_files(folder: str, comm_kernels=()) -> pd.DataFrame:
    """Every *.json / *.json.gz in `folder`, each one rank's torch.profiler trace (its rank from
    distributedInfo.rank, else its place in name order), as one table."""
    names = sorted(n for n in os.listdir(folder) if n.endswith(TRACE_SUFFIXES))
    if not names:
        raise TraceError(f"{folder}: no .json or .json.gz traces in this directory; pass a trace "
                         f"file or a directory of per-rank torch.profiler traces")
    frames, seen, worlds = [], {}, {}
    for i, name in enumerate(names):
        path = os.path.join(folder, name)
        doc = read_doc(path)
        if not isinstance(doc, dict) or not is_kineto(doc):
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
        frames.append(FORMAT_OF["kineto"].read(doc, comm_kernels))
    df = pd.concat(frames, ignore_index=True).sort_values(["rank", "ts"], kind="stable")
    df = df.reset_index(drop=True)
    df.attrs.update(format="kineto", path=folder, metadata=Shared(ranks=sorted(seen)),
                    comm_kernels=tuple(comm_kernels), world_size=max(worlds.values()))
    return df


def detect(doc) -> str:
    """The name of the document's format (FORMATS), or raise TraceError naming what is missing."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError("not a Chrome trace (expected a JSON object with a 'traceEvents' list)")
    fmt = next((f.name for f in FORMATS if f.recognise(doc)), None)
    if fmt is None:
        raise TraceError(f"unknown trace format (neither {' nor '.join(f.described for f in FORMATS)}); "
                         f"record it with {' or '.join(f.recorded_by for f in FORMATS)}")
    events = doc["traceEvents"]
    if not events:
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
    df.attrs.update(format=fmt, path=path, metadata=Shared(doc.get("metadata") or {}),
                    comm_kernels=tuple(comm_kernels),
                    world_size=int((doc.get("distributedInfo") or {}).get("world_size") or 1))
    return df


TRACE_SUFFIXES = (".json", ".json.gz")


def load(path: str, comm_kernels=()) -> pd.DataFrame:
    """Events of a partui or torch.profiler trace; `df.attrs` holds format and metadata. A
    directory of per-rank torch.profiler traces (HTA's input) is read as one multi-rank trace.
    comm_kernels: regexes naming more GPU comm kernels (beside comm_kernels.FAMILIES)."""
    comm_kernels = tuple(comm_kernels or ())
    families(comm_kernels)  # a bad pattern fails here, before the file is read
    was_enabled = gc.isenabled()
    gc.disable()  # millions of new event dicts would trigger the cyclic GC over and over
    try:
        if os.path.isdir(path):
            return load_rank_files(path, comm_kernels)
        return frame(read_doc(path), path, comm_kernels)
    finally:
        if was_enabled:
            gc.enable()
