"""Per-rank trace recording (the rank side; partui.recording.tracefile merges the ranks into one Chrome
trace).

Each worker runs a `RankTracer`: it is the `kernels.comm.events` recorder (compute spans, comm
issue/complete/wait, counters) and, beside it, viztracer: sparse mode (the default) logs the
functions partui.recording.sparse_log wraps with viztracer's log_sparse (layer forward / backward_input /
backward_weight, the optimizer step, each schedule action); sparse=False traces every Python call.
The main thread's viztracer calls join the rank's compute track (same pid, tid, clock), so the call
tree sits under the recorder's spans; viztracer's category "FEE" keeps them out of every figure
(partui.analysis.figures.definitions "python"). `stop()` returns plain JSON-able Chrome events with
pid = rank and ts in microseconds from perf_counter_ns; the controller stitches and merges them
(partui.recording.tracefile.merge: process/thread names and send->recv flow arrows).
"""
from __future__ import annotations

import builtins
import gc
import os
import sys
import threading
import time

from viztracer import VizTracer

from kernels.comm import events
from partui.recording.sparse_log import wrap_sparse
from partui.recording.tracefile import COMPUTE_OVERFLOW_TID, COMPUTE_TID, GC_TID, PY_TID, assign_comm_lanes

# the folder holding kernels/ and partui/: stripped from viztracer's "fn (path:line)" names
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


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
        self._gc: list[tuple] = []  # (generation, t0, t1, collected): the cyclic GC's pauses
        self._gc_t0 = 0
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

    def _on_gc(self, phase, info):
        """gc.callbacks: each collection while recording, a pause of every thread holding the GIL
        (issue 33's stall was one: a full collection inside an RMSNorm forward, read as compute)."""
        if phase == "start":
            self._gc_t0 = events.now_ns()
        else:
            self._gc.append((info["generation"], self._gc_t0, events.now_ns(), info["collected"]))

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "RankTracer":
        self._viz = _start_viztracer(self.sparse) if self.python else None
        self._t_start = events.now_ns()
        events.set_recorder(self)
        gc.callbacks.append(self._on_gc)
        return self

    def stop(self) -> dict:
        """Uninstall and return {"rank", "coords", "events", "t0_us", "t1_us", "viztracer"}."""
        if events.recorder() is self:
            events.set_recorder(None)
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._t_stop = events.now_ns()
        viz_events, viz_info = _stop_viztracer(self._viz, self.rank)
        self._viz = None
        with self._lock:
            issues, complete, waits = dict(self._issues), dict(self._complete), list(self._waits)
            posts = list(self._posts)
        evs = self._compute_track(issues, waits, posts)
        nest_python(evs, viz_events)
        evs += self._comm_tracks(issues, complete, waits)
        evs += [{"ph": "C", "name": n, "pid": self.rank, "tid": COMPUTE_TID, "ts": _us(t),
                 "args": v} for n, t, v in self._counters]
        evs += [{"ph": "X", "name": f"gc gen{g}", "cat": "gc", "pid": self.rank, "tid": GC_TID,
                 "ts": _us(t0), "dur": _us(t1 - t0), "args": {"generation": g, "collected": n}}
                for g, t0, t1, n in self._gc]
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


# ---------------------------------------------------------------- viztracer

def nest_python(track: list[dict], viz_events: list[dict]) -> None:
    """Move the main thread's viztracer calls (tid PY_TID) onto the compute track, in place, where
    they nest among its spans: the Python call tree under each span. The recorder's spans keep
    their places; a call one of them would cross (viztracer's clock is the TSC scaled to ours, and
    a wait's span can start before the call that waits) stays on PY_TID. Times go to whole ns, as
    the recorder's, so Perfetto's rounding cannot make a child outlast its parent."""
    spans = [(round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000), 0, e)
             for e in track if e["tid"] == COMPUTE_TID]
    for e in viz_events:
        if e["tid"] == PY_TID and e.get("ph") == "X":
            t0 = round(e["ts"] * 1000)
            spans.append((t0, max(t0, round((e["ts"] + e.get("dur", 0)) * 1000)), 1, e))
    spans.sort(key=lambda s: (s[0], s[0] - s[1], s[2]))  # parents first; a recorder span at a tie
    stack = []  # the open spans, innermost last
    for t0, t1, is_call, e in spans:
        while stack and stack[-1][1] <= t0:
            stack.pop()
        if not is_call:
            while stack and stack[-1][2] and stack[-1][1] < t1:  # calls it would cross stay aside
                stack.pop()[3]["tid"] = PY_TID
            stack.append((t0, t1, is_call, e))
        elif not stack or t1 <= stack[-1][1]:
            e.update(tid=COMPUTE_TID, ts=_us(t0), dur=_us(t1 - t0))
            stack.append((t0, t1, is_call, e))


def _start_viztracer(sparse: bool):
    """Sparse: viztracer's log_sparse around the functions partui.recording.sparse_log names (no profile
    hook);
    full: viztracer's profile hook on every Python call of every thread."""
    if sparse:
        viz = sparse_viztracer(100_000)
        viz.undo_wraps = wrap_sparse(viz)
    else:
        viz = VizTracer(tracer_entries=2_000_000, verbose=0)
        viz.undo_wraps = None
    viz.sync_start = clock_pair(viz)
    if not sparse:
        viz.start()
    return viz


def sparse_viztracer(entries: int) -> VizTracer:
    """A VizTracer for log_sparse only. Python < 3.12: its constructor installs its profile hook
    (5x slower calls); log_sparse's wrappers add their events themselves and need none."""
    viz = VizTracer(tracer_entries=entries, verbose=0, log_sparse=True)
    if sys.getprofile() is viz:
        sys.setprofile(None)
    if getattr(getattr(threading, "_profile_hook", None), "__self__", None) is viz:
        threading.setprofile(None)
    return viz


def forget_viztracer(viz) -> None:
    """Remove what a VizTracer left installed: its profile hook and its global registration."""
    if sys.getprofile() is viz:
        sys.setprofile(None)
    if getattr(builtins, "__viz_tracer__", None) is viz:
        del builtins.__viz_tracer__


def _stop_viztracer(viz, rank: int) -> tuple[list[dict], dict]:
    """This rank's viztracer events on our clock, pid = rank: the main thread's on tid PY_TID (stop()
    moves its calls onto the compute track where they nest), other threads' on PY_TID + 1, ..."""
    if viz is None:
        return [], {"mode": "off"}
    if viz.enable:
        viz.stop()
    if viz.undo_wraps is not None:
        viz.undo_wraps()
    to_ours = clock_map(viz.sync_start, clock_pair(viz))
    raw = viz.load()
    forget_viztracer(viz)
    tids: dict = {threading.main_thread().native_id: PY_TID}  # main: the one that joins compute
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
        if "name" in e:   # "fn (/abs/path/kernels/x.py:12)" -> "fn (kernels/x.py:12)": no machine's paths
            e["name"] = e["name"].replace(SOURCE_ROOT, "")
        if "ts" in e:
            e["ts"] = to_ours(e["ts"])
        if "dur" in e:
            e["dur"] = e["dur"] * to_ours.rate
        out.append(e)
    thread_names = {str(t): f"py {names.get(orig, orig)}" for orig, t in tids.items()}
    return out, {"mode": "sparse" if viz.log_sparse else "full", "clock_rate": to_ours.rate,
                 "threads": thread_names}


def clock_pair(viz, reads: int = 32) -> tuple[float, float]:
    """(our clock, viztracer's) in us, read together: of `reads` brackets (ours, viztracer's, ours)
    the narrowest, its midpoint against viztracer's reading. One bracket alone is off by half of
    any preemption between its reads (tens of us on a busy machine: calls then cross the spans
    they ran under); a preempted bracket is wide, so the narrowest is the truest."""
    viz.getts()  # viztracer calibrates its clock at its first reading: that one is off by ~50 us
    best = None
    for _ in range(reads):
        a = time.perf_counter_ns()
        v = viz.getts()
        b = time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, a + b, v)
    return _us(best[1]) / 2, best[2]


def clock_map(start: tuple, stop: tuple):
    """viztracer's us -> ours: viztracer reads the TSC scaled by a factor it calibrated once, which
    drifts from CLOCK_MONOTONIC (perf_counter's clock) by tens of us over a run; the line through
    two readings, one at start and one at stop, removes the drift."""
    (p0, v0), (p1, v1) = start, stop
    rate = (p1 - p0) / (v1 - v0) if v1 - v0 > 1000 else 1.0  # under 1 ms: the offset alone

    def to_ours(v: float) -> float:
        return p0 + (v - v0) * rate
    to_ours.rate = rate
    return to_ours
