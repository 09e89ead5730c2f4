"""A Chrome trace read as a stream: the `traceEvents` array cut into batches of whole events, each
batch handed on as its own bytes, so no more than a batch or two of the file is held at once.

The cut is made at a `}` `,` `{` between events, found by a regex over the raw bytes, not by a
parser. A cut that lands inside a string or a nested array leaves text that is not JSON, so a
batch whose decode fails is joined to the next block and tried again: a wrong cut costs time,
never a wrong event. The text before the array (its keys) and after it (the last events, the
closing keys) is decoded as one small document: `head`.
"""
from __future__ import annotations

import gzip
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator

BLOCK = 8 << 20  # bytes read at a time: large enough for the decoders, small beside the trace; under
# glibc's largest mmap threshold (32 MB), so each batch's buffers reuse freed heap instead of faulting in
# fresh pages (1M kernels: 1.0 s of system time, not 2.2)
ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
BETWEEN = re.compile(rb"\}\s*,\s*\{")  # the gap between two events (or a false cut, see above)
LAST_TRIES = 64  # `}` tried one by one from a block's end before a regex search (json_stream.last_cut)
HEAD_LIMIT = 64 << 20  # the array's key must start within this many bytes, else: not streamed


class NotStreamable(Exception):
    """The file is not laid out as a Chrome trace object with a traceEvents array near its start:
    the caller reads it whole instead (where its errors are named)."""


@dataclass
class Stream:
    """What `batches` saw: the document's other keys and the events after the last cut (`head`),
    the bytes read so far (`read`) and the file's size on disk (`size`)."""
    size: int
    read: int = 0
    head: dict = field(default_factory=dict)


def opener(path: str):
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")


def batches(path: str, size: int, decode: Callable[[bytes], object],
            try_batch: Callable[[bytes], object], progress: Callable[[Stream], None] = lambda s: None,
            ) -> Iterator[object]:
    """Yields try_batch(bytes of whole events, comma separated, without the brackets) for each
    batch that it accepts (it returns None for text that is not whole events); the last stream
    state is the generator's return value (its `head` holds the other keys and the last events)."""
    state = Stream(size)
    with opener(path) as f:
        buf = f.read(BLOCK)
        while True:  # the array's start: a few bytes in, unless a big key precedes it
            found = ARRAY_START.search(buf)
            if found or len(buf) > HEAD_LIMIT:
                break
            more = f.read(BLOCK)
            if not more:
                break
            buf += more
        if not found or not _top_level(buf[:found.start()]):
            raise NotStreamable("no traceEvents array near the start")
        prefix, buf = buf[:found.end()], buf[found.end():]
        state.read = len(prefix)
        start = 0  # where the pending events begin in buf (after the previous cut)
        while True:
            more = f.read(BLOCK)
            if not more:
                break
            buf = buf[start:] + more
            start = 0
            cut = last_cut(buf)
            if cut is None:
                continue
            got = try_batch(buf[:cut + 1])
            if got is None:  # a false cut: keep the text, join the next block
                continue
            start = _next_event(buf, cut)
            state.read += start
            progress(state)
            yield got
        rest = buf[start:]
        cut = last_cut(rest)  # the last block's events too, but for the last few (in head)
        got = None if cut is None else try_batch(rest[:cut + 1])
        if got is not None:
            rest = rest[_next_event(rest, cut):]
            state.read += len(buf) - start - len(rest)
            yield got
    state.read += len(rest)
    try:
        state.head = decode(prefix + rest)
    except ValueError as exc:
        raise NotStreamable(f"the text around the events is not JSON ({exc})") from None
    progress(state)
    return state


STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def _top_level(prefix: bytes) -> bool:
    """The key is the document's own (depth 1), not one inside another key's object."""
    bare = STRING.sub(b'""', prefix)  # braces inside strings do not nest
    return bare.count(b"{") - bare.count(b"}") == 1 and bare.count(b"[") == bare.count(b"]")


def last_cut(buf: bytes) -> int | None:
    """The offset of the `}` of the last event gap in buf. The last few `}` are tried from the end (an
    event holds a handful: its args, its own close), each by one regex match; past LAST_TRIES of them (an
    event longer than a few, or no gap at all) a regex search from the end, one block back."""
    end = len(buf)
    for _ in range(LAST_TRIES):
        at = buf.rfind(b"}", 0, end)
        if at < 0:
            return None
        if BETWEEN.match(buf, at):
            return at
        end = at
    tail = max(end - (1 << 20), 0)
    while True:
        last = None
        for last in BETWEEN.finditer(buf, tail, end + 1):
            pass
        if last is not None:
            return last.start()
        if tail == 0:
            return None
        tail = max(tail - (8 << 20), 0)


def _next_event(buf: bytes, cut: int) -> int:
    return BETWEEN.match(buf, cut).end() - 1  # the `{` that opens the next event
