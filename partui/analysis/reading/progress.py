"""Progress of a long read on a terminal: after about a second, one line on stderr rewritten in
place (bytes read of the file's size, events read, rank files done), cleared when the read ends.
Quiet when stderr is not a terminal (a pipe, a file, a test) or the caller asks (`--format json`)."""
from __future__ import annotations

import sys
import time

DELAY_S = 1.0  # a read shorter than this shows nothing
EVERY_S = 0.2  # the line is rewritten at most this often


class Progress:
    def __init__(self, label: str, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.start = time.monotonic()
        self.last = 0.0
        self.shown = False

    def show(self, text: str, force: bool = False) -> None:
        """Rewrite the line with `text`, when enabled and past the delay (or forced)."""
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and (now - self.start < DELAY_S or now - self.last < EVERY_S):
            return
        self.last = now
        self.shown = True
        self.stream.write(f"\r\x1b[K{self.label}: {text}")
        self.stream.flush()

    def done(self) -> None:
        """Clear the line, so what is printed next starts on a clean one."""
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def read_text(read: int, size: int, events: int, gz: bool) -> str:
    """`312 of 1,024 MB read, 1,075,096 events` (a gzip'd file: the bytes unpacked so far)."""
    mb = read / 2**20
    where = f"{mb:,.0f} MB unpacked" if gz else f"{mb:,.0f} of {size / 2**20:,.0f} MB read"
    return f"{where}, {events:,} events"
