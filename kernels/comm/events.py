"""The recorder hook: how kernels report compute spans and comm ops to whoever listens.

It is a no-op until `set_recorder` installs an object (partui.recording.trace does, while tracing).
Times are `time.perf_counter_ns()`, CLOCK_MONOTONIC on Linux, so ranks on one host share a clock.

A recorder implements any of these methods (missing ones are skipped):
    compute(name, cat, t0_ns, t1_ns, args)            a finished compute span on the rank's compute track
                                                      (args["cpu_us"]: the thread CPU time it used)
    comm_issue(op_id, op, group, nbytes, peer, t_ns, args)
    comm_posted(op_id, t0_ns, t1_ns)                   the caller spent [t0, t1] posting op_id (not compute)
    comm_complete(op_id, t_ns)                         may be called from a communication thread
    comm_wait(op_id, t0_ns, t1_ns)                     the rank blocked waiting for op_id
    counter(name, t_ns, values)                        a dict of numbers (expert load, memory ...)

Beside the recorder, a region hook (`set_regions`, partui.recording.profile installs torch.profiler's
record_function): every span runs inside region(name, cat, args), and every comm op's issue is
marked by an empty one (`mark`, as is its completion) and each wait on one is a range
(`region`), so a profiler sees partui's names while the code runs, not after.
"""
from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

from kernels.comm.flight import recorder as _flight

now_ns = time.perf_counter_ns
thread_cpu_ns = time.thread_time_ns  # CPU time this thread got: wall minus it is time without a core

_recorder = None
_regions = None  # (name, cat, args) -> a context manager, or None
# every finished span since the last drain, (cat, t0, t1): the engine's step figures read it, tracer or not
_spans: list[tuple[str, int, int]] = []
SPAN_LOG_CAP = 1 << 20  # a process that never drains (a reference model, a bench) keeps the newest half


def set_recorder(recorder) -> None:
    """Install (or with None remove) the process-wide recorder."""
    global _recorder
    _recorder = recorder


def recorder():
    return _recorder


def set_regions(regions) -> None:
    """Install (or with None remove) the region hook: regions(name, cat, args) -> context manager.
    The args dict it is given is the region's own: once the region ends it holds t_ns and t_end_ns,
    the region's times on this clock (the profiler's edges can be late: partui.recording.profile uses
    these)."""
    global _regions
    _regions = regions


@contextmanager
def region(name: str, cat: str, **args):
    """A range for the region hook only (the recorder gets waits another way): a wait on an op.
    Yields its args, whose t_ns / t_end_ns a caller timing the same thing itself may set."""
    regions = _regions
    if regions is None:
        yield args
        return
    with regions(name, cat, args):
        args["t_ns"] = now_ns()
        try:
            yield args
        finally:
            args["t_end_ns"] = now_ns()


def mark(name: str, cat: str, t_ns: int, **args) -> None:
    """An empty region: a point the profiler shows with its args (a comm op's issue and bytes);
    t_ns is the moment it stands for and t_mark_ns when it was made, just before the profiler
    stamped it (so a reader can put this clock's times on the profiler's)."""
    regions = _regions
    if regions is not None:
        with regions(name, cat, {**args, "t_ns": t_ns, "t_mark_ns": now_ns()}):
            pass


@contextmanager
def span(name: str, cat: str = "compute", **args):
    """Time a compute region; `cat` is its kind (F, B, W, optimizer, attention, expert ...)."""
    rec, regions = _recorder, _regions
    if len(_spans) > SPAN_LOG_CAP:
        del _spans[:SPAN_LOG_CAP // 2]
    outer, _flight.span = _flight.span, name   # the flight recorder's "where is this rank now"
    try:
        yield from _timed(name, cat, rec, regions, args)
    finally:
        _flight.span = outer


def _timed(name, cat, rec, regions, args):
    """span's body: the span log, and the recorder and region hook where installed."""
    if rec is None and regions is None:   # no tracer, no profiler: the engine's span log only
        t0 = now_ns()
        try:
            yield
        finally:
            _spans.append((cat, t0, now_ns()))
        return
    times = dict(args)                   # the region hook's args: t_ns / t_end_ns once it ends
    with regions(name, cat, times) if regions is not None else nullcontext():
        t0, c0 = now_ns(), thread_cpu_ns()
        try:
            yield
        finally:
            t1, c1 = now_ns(), thread_cpu_ns()
            _spans.append((cat, t0, t1))
            times.update(t_ns=t0, t_end_ns=t1)
            if rec is not None:
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
