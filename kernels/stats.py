"""Per-step figures a rank's layers record while they run (expert load, attention time), kept in the
rank's context and drained by the engine into each step's result.

Each kind of layer keeps one collector: an object whose `take()` returns its figures since the last
call as a dict and starts over. Layers built outside an engine (tests, the single-process
reference) get a StepStats of their own, so nothing is shared between ranks or engines.
"""
from __future__ import annotations


class StepStats:
    """The collectors of one rank, by kind; `drain()` merges and resets them all."""

    def __init__(self):
        self.collectors: dict[str, object] = {}

    def collector(self, kind: str, make):
        """The collector of `kind`, made by `make()` the first time it is asked for."""
        if kind not in self.collectors:
            self.collectors[kind] = make()
        return self.collectors[kind]

    def drain(self) -> dict:
        """Every collector's figures since the last drain, merged into one dict."""
        out = {}
        for collector in self.collectors.values():
            out.update(collector.take())
        return out
