"""Per-rank trace recording (the rank side; partui.tracefile merges the ranks into one Chrome trace).

Each worker runs a `RankTracer`: it is the `kernels.comm.events` recorder (compute spans, comm
issue/complete/wait, counters) and, beside it, a viztracer in sparse mode (only @log_sparse
functions) or, with sparse=False, full function tracing. `stop()` returns plain JSON-able Chrome
events with pid = rank and ts in microseconds from perf_counter_ns; the controller stitches and
merges them (partui.tracefile.merge: process/thread names and send->recv flow arrows).
"""
from __future__ import annotations

import builtins
import sys
import threading
import time

from kernels.comm import events
from partui.tracefile import COMPUTE_OVERFLOW_TID, COMPUTE_TID, PY_TID, assign_comm_lanes


def _us(t_ns: int) -> float:
    return t_ns / 1000.0  # perf_counter_ns -> microseconds, exact to the ns below 2**53 ns


class RankTracer:
    """The recorder of one rank. `start()`, run steps, `stop() -> dict` of this rank's events."""

    def __init__(self, rank: int, coords: str = "", sparse: bool = True, python: bool = True):
        """python=False: no viztracer beside the recorder (a bench's own spans only)."""
        self.rank, self.coords, self.sparse, self.python = int(rank), coords, sparse, python
        self._lock = threading.Lock()  # comm_complete arrives on gloo's thread
        self._compute: list[tuple] = []  # (name, cat, t0, t1, args)
        self._issues: dict[int, tuple] = {}  # op_id -> (op, group, nbytes, peer, t_ns, args)
        self._complete: dict[int, int] = {}  # op_id -> t_ns
        self._waits: list[tuple] = []  # (op_id, t0, t1)
        self._posts: list[tuple] = []  # (op_id, t0, t1): the caller posting an op
        self._counters: list[tuple] = []  # (name, t_ns, values)
        self._viz = None
        self._t_start = self._t_stop = None

    # ------------------------------------------------------------ recorder protocol
    def compute(self, name, cat, t0_ns, t1_ns, args):
        self._compute.append((name, cat, t0_ns, t1_ns, dict(args) if args else {}))

    def comm_issue(self, op_id, op, group, nbytes, peer, t_ns, args):
        with self._lock:
            self._issues[op_id] = (op, group, int(nbytes), peer, t_ns, dict(args) if args else {})

    def comm_complete(self, op_id, t_ns):
        with self._lock:
            self._complete.setdefault(op_id, t_ns)

    def comm_posted(self, op_id, t0_ns, t1_ns):
        with self._lock:
            self._posts.append((op_id, t0_ns, t1_ns))

    def comm_wait(self, op_id, t0_ns, t1_ns):
        with self._lock:
            self._waits.append((op_id, t0_ns, t1_ns))

    def counter(self, name, t_ns, values):
        self._counters.append((name, t_ns, dict(values)))

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "RankTracer":
        self._viz = _start_viztracer(self.sparse) if self.python else None
        self._t_start = events.now_ns()
        events.set_recorder(self)
        return self

    def stop(self) -> dict:
        """Uninstall and return {"rank", "coords", "events", "t0_us", "t1_us", "viztracer"}."""
        if events.recorder() is self:
            events.set_recorder(None)
        self._t_stop = events.now_ns()
        viz_events, viz_info = _stop_viztracer(self._viz, self.rank)
        self._viz = None
        with self._lock:
            issues, complete, waits = dict(self._issues), dict(self._complete), list(self._waits)
            posts = list(self._posts)
        evs = self._compute_track(issues, waits, posts) + self._comm_tracks(issues, complete, waits)
        evs += [{"ph": "C", "name": n, "pid": self.rank, "tid": COMPUTE_TID, "ts": _us(t),
                 "args": v} for n, t, v in self._counters]
        return {"rank": self.rank, "coords": self.coords, "events": evs + viz_events,
                "t0_us": _us(self._t_start or self._t_stop), "t1_us": _us(self._t_stop),
                "viztracer": viz_info}

    # ------------------------------------------------------------ building tracks
    def _compute_track(self, issues, waits, posts=()) -> list[dict]:
        spans = [(t0, t1, name, cat, args) for name, cat, t0, t1, args in self._compute]
        for verb, cat, found in (("wait", "wait", waits), ("post", "post", posts)):
            for op_id, t0, t1 in found:
                op, group = issues.get(op_id, ("?", "?"))[:2]
                spans.append((t0, t1, f"{verb} {op}", cat, {"op_id": op_id, "op": op, "group": group}))
        # parents first at equal start, so the stack check below sees true nesting
        spans.sort(key=lambda s: (s[0], -(s[1] - s[0])))
        out, stack = [], []
        for t0, t1, name, cat, args in spans:
            while stack and stack[-1] <= t0:
                stack.pop()
            nests = not stack or t1 <= stack[-1]
            if nests:
                stack.append(t1)
            # a span that would cross its parent's end (e.g. a wait from another thread) moves aside
            out.append({"ph": "X", "name": name, "cat": cat, "pid": self.rank,
                        "tid": COMPUTE_TID if nests else COMPUTE_OVERFLOW_TID,
                        "ts": _us(t0), "dur": _us(t1 - t0), "args": args})
        return out

    def _comm_tracks(self, issues, complete, waits) -> list[dict]:
        wait_end: dict[int, int] = {}
        for op_id, _t0, t1 in waits:
            wait_end[op_id] = min(t1, wait_end.get(op_id, t1))
        ops = []
        for op_id, (op, group, nbytes, peer, t_issue, args) in issues.items():
            ends = [t for t in (complete.get(op_id), wait_end.get(op_id)) if t is not None]
            unfinished = False
            if ends:  # done at the earlier of its future's callback and the return of a wait
                t_end = max(t_issue, min(ends))
            elif nbytes == 0:  # a group of one: nothing moved, done at issue
                t_end = t_issue
            else:
                t_end, unfinished = max(t_issue, self._t_stop), True
            a = {"op": op, "group": group, "bytes": nbytes, "peer": peer, "op_id": op_id, **args}
            if unfinished:
                a["unfinished"] = True
            ops.append({"ph": "X", "name": op, "cat": "comm", "pid": self.rank, "tid": None,
                        "ts": _us(t_issue), "dur": _us(t_end - t_issue), "args": a})
        assign_comm_lanes(ops)
        return ops


# ---------------------------------------------------------------- viztracer, cheaply

def _start_viztracer(sparse: bool):
    try:  # lazy and optional: viztracer is a heavy extra; without it the recorder's spans remain
        from viztracer import VizTracer
    except ImportError:
        return None
    if sparse:
        viz = VizTracer(tracer_entries=100_000, verbose=0, log_sparse=True)
        # Python < 3.12: the constructor already installed its profile hook (5x slower calls);
        # sparse mode records only @log_sparse functions, which need no hook.
        if sys.getprofile() is viz:
            sys.setprofile(None)
        if getattr(getattr(threading, "_profile_hook", None), "__self__", None) is viz:
            threading.setprofile(None)
    else:
        viz = VizTracer(tracer_entries=2_000_000, verbose=0)
        viz.start()
    return viz


def _stop_viztracer(viz, rank: int) -> tuple[list[dict], dict]:
    if viz is None:
        return [], {"available": False}
    if viz.enable:
        viz.stop()
    # viztracer reads CLOCK_MONOTONIC in us, as perf_counter does; measure any offset anyway
    a = time.perf_counter_ns()
    v = viz.getts()
    b = time.perf_counter_ns()
    offset_us = v - _us(a + b) / 2
    raw = viz.load()
    if sys.getprofile() is viz:
        sys.setprofile(None)
    if getattr(builtins, "__viz_tracer__", None) is viz:
        del builtins.__viz_tracer__
    tids: dict = {}
    names: dict = {}
    out = []
    for e in raw:
        if e.get("ph") == "M":
            if e.get("name") == "thread_name":
                names[e.get("tid")] = e["args"]["name"]
            continue
        if e.get("ph") not in ("X", "i", "C"):
            continue
        tid = tids.setdefault(e.get("tid"), PY_TID + len(tids))
        e = dict(e, pid=rank, tid=tid)
        if "ts" in e:
            e["ts"] = e["ts"] - offset_us
        out.append(e)
    thread_names = {str(t): f"py {names.get(orig, orig)}" for orig, t in tids.items()}
    return out, {"available": True, "clock_offset_us": offset_us, "threads": thread_names}
