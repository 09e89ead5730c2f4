"""The recorder hook: how kernels report compute spans and comm ops to whoever listens.

It is a no-op until `set_recorder` installs an object (partui.trace does, while tracing).
Times are `time.perf_counter_ns()`, CLOCK_MONOTONIC on Linux, so ranks on one host share a clock.

A recorder implements any of these methods (missing ones are skipped):
    compute(name, cat, t0_ns, t1_ns, args)            a finished compute span on the rank's compute track
                                                      (args["cpu_us"]: the thread CPU time it used)
    comm_issue(op_id, op, group, nbytes, peer, t_ns, args)
    comm_posted(op_id, t0_ns, t1_ns)                   the caller spent [t0, t1] posting op_id (not compute)
    comm_complete(op_id, t_ns)                         may be called from a communication thread
    comm_wait(op_id, t0_ns, t1_ns)                     the rank blocked waiting for op_id
    counter(name, t_ns, values)                        a dict of numbers (expert load, memory ...)
"""
from __future__ import annotations

import time
from contextlib import contextmanager

now_ns = time.perf_counter_ns
thread_cpu_ns = time.thread_time_ns  # CPU time this thread got: wall minus it is time without a core

_recorder = None
# every finished span since the last drain, (cat, t0, t1): the engine's step figures read it, tracer or not
_spans: list[tuple[str, int, int]] = []
SPAN_LOG_CAP = 1 << 20  # a process that never drains (a reference model, a bench) keeps the newest half


def set_recorder(recorder) -> None:
    """Install (or with None remove) the process-wide recorder."""
    global _recorder
    _recorder = recorder


def recorder():
    return _recorder


@contextmanager
def span(name: str, cat: str = "compute", **args):
    """Time a compute region; `cat` is its kind (F, B, W, optimizer, attention, expert ...)."""
    rec = _recorder
    if len(_spans) > SPAN_LOG_CAP:
        del _spans[:SPAN_LOG_CAP // 2]
    if rec is None:
        t0 = now_ns()
        try:
            yield
        finally:
            _spans.append((cat, t0, now_ns()))
        return
    t0, c0 = now_ns(), thread_cpu_ns()
    try:
        yield
    finally:
        t1, c1 = now_ns(), thread_cpu_ns()
        _spans.append((cat, t0, t1))
        rec.compute(name, cat, t0, t1, {**args, "cpu_us": (c1 - c0) / 1000})


def drain_spans() -> list[tuple[str, int, int]]:
    """Every span (cat, t0_ns, t1_ns) finished since the last drain, and forget them."""
    global _spans
    out, _spans = _spans, []
    return out


def counter(name: str, **values) -> None:
    rec = _recorder
    if rec is not None and hasattr(rec, "counter"):
        rec.counter(name, now_ns(), values)
