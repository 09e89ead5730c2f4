"""Per-rank trace recording and the merge into one Chrome trace that opens in Perfetto.

Each worker runs a `RankTracer`: it is the `kernels.comm.events` recorder (compute spans, comm
issue/complete/wait, counters) and, beside it, a viztracer in sparse mode (only @log_sparse
functions) or, with sparse=False, full function tracing. `stop()` returns plain JSON-able Chrome
events with pid = rank and ts in microseconds from perf_counter_ns; the controller calls
`merge([...], path, metadata)` which adds process/thread names and send->recv flow arrows.

Tracks (tids) per rank: 1 compute, 2.. comm lanes (in-flight comm ops overlap each other, so each
lane holds non-overlapping ones), 1000+ compute overflow, 2000+ viztracer threads.
"""
from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
import threading
import time

from kernels.comm import events

COMPUTE_TID = 1
COMM_TID = 2  # lanes COMM_TID, COMM_TID + 1, ...; names "comm", "comm 2", ...
COMPUTE_OVERFLOW_TID = 1000
PY_TID = 2000
P2P_OPS = ("send", "recv")


def _us(t_ns: int) -> float:
    return t_ns / 1000.0  # perf_counter_ns -> microseconds, exact to the ns below 2**53 ns


class RankTracer:
    """The recorder of one rank. `start()`, run steps, `stop() -> dict` of this rank's events."""

    def __init__(self, rank: int, coords: str = "", sparse: bool = True):
        self.rank, self.coords, self.sparse = int(rank), coords, sparse
        self._lock = threading.Lock()  # comm_complete arrives on gloo's thread
        self._compute: list[tuple] = []  # (name, cat, t0, t1, args)
        self._issues: dict[int, tuple] = {}  # op_id -> (op, group, nbytes, peer, t_ns, args)
        self._complete: dict[int, int] = {}  # op_id -> t_ns
        self._waits: list[tuple] = []  # (op_id, t0, t1)
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

    def comm_wait(self, op_id, t0_ns, t1_ns):
        with self._lock:
            self._waits.append((op_id, t0_ns, t1_ns))

    def counter(self, name, t_ns, values):
        self._counters.append((name, t_ns, dict(values)))

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "RankTracer":
        self._viz = _start_viztracer(self.sparse)
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
        evs = self._compute_track(issues, waits) + self._comm_tracks(issues, complete, waits)
        evs += [{"ph": "C", "name": n, "pid": self.rank, "tid": COMPUTE_TID, "ts": _us(t),
                 "args": v} for n, t, v in self._counters]
        return {"rank": self.rank, "coords": self.coords, "events": evs + viz_events,
                "t0_us": _us(self._t_start or self._t_stop), "t1_us": _us(self._t_stop),
                "viztracer": viz_info}

    # ------------------------------------------------------------ building tracks
    def _compute_track(self, issues, waits) -> list[dict]:
        spans = [(t0, t1, name, cat, args) for name, cat, t0, t1, args in self._compute]
        for op_id, t0, t1 in waits:
            op, group = issues.get(op_id, ("?", "?"))[:2]
            spans.append((t0, t1, f"wait {op}", "wait", {"op_id": op_id, "op": op, "group": group}))
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
            ops.append((t_issue, t_end, op_id, op, a))
        ops.sort()
        lane_end: list[int] = []  # greedy interval colouring: first lane free at issue time
        out = []
        for t0, t1, _op_id, op, a in ops:
            lane = next((i for i, e in enumerate(lane_end) if e <= t0), len(lane_end))
            if lane == len(lane_end):
                lane_end.append(t1)
            lane_end[lane] = t1
            out.append({"ph": "X", "name": op, "cat": "comm", "pid": self.rank,
                        "tid": COMM_TID + lane, "ts": _us(t0), "dur": _us(t1 - t0), "args": a})
        return out


# ---------------------------------------------------------------- viztracer, cheaply

def _start_viztracer(sparse: bool):
    try:
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
    if getattr(__import__("builtins"), "__viz_tracer__", None) is viz:
        del __import__("builtins").__viz_tracer__
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


# ---------------------------------------------------------------- merge

def flow_events(per_rank: list[dict]) -> list[dict]:
    """Pair the k-th send a->b with tag t to the k-th recv on b from a with tag t: s/f arrows."""
    sends: dict[tuple, list[dict]] = {}
    recvs: dict[tuple, list[dict]] = {}
    for r in per_rank:
        for e in r["events"]:
            a = e.get("args") or {}
            if e.get("cat") == "comm" and a.get("op") in P2P_OPS and a.get("peer") is not None:
                me, peer, tag = e["pid"], int(a["peer"]), a.get("tag", 0)
                if a["op"] == "send":
                    sends.setdefault((me, peer, tag), []).append(e)
                else:
                    recvs.setdefault((peer, me, tag), []).append(e)
    out, flow_id = [], 0
    for key in sorted(sends):
        ss = sorted(sends[key], key=lambda e: e["ts"])
        rr = sorted(recvs.get(key, []), key=lambda e: e["ts"])
        for s, r in zip(ss, rr):
            flow_id += 1
            # just inside each slice (binds to it), send near its start and recv near its end:
            # Perfetto drops a flow whose end comes before its start
            s_ts = s["ts"] + s["dur"] * 0.01
            f_ts = max(r["ts"] + r["dur"] * 0.99, s_ts)
            out.append({"ph": "s", "id": flow_id, "name": "p2p", "cat": "flow", "pid": s["pid"],
                        "tid": s["tid"], "ts": s_ts})
            out.append({"ph": "f", "bp": "e", "id": flow_id, "name": "p2p", "cat": "flow",
                        "pid": r["pid"], "tid": r["tid"], "ts": f_ts})
    return out


def _names(r: dict) -> list[dict]:
    rank = r["rank"]
    label = f"rank {rank} · {r['coords']}" if r.get("coords") else f"rank {rank}"
    meta = [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": label}},
            {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
             "args": {"sort_index": rank}}]
    tids = sorted({e["tid"] for e in r["events"]} | {COMPUTE_TID, COMM_TID})
    py = (r.get("viztracer") or {}).get("threads", {})
    for tid in tids:
        if tid == COMPUTE_TID:
            name = "compute"
        elif tid == COMPUTE_OVERFLOW_TID:
            name = "compute (other thread)"
        elif tid >= PY_TID:
            name = py.get(str(tid), f"py {tid}")
        else:
            name = "comm" if tid == COMM_TID else f"comm {tid - COMM_TID + 1}"
        meta.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
        meta.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                     "args": {"sort_index": tid}})
    return meta


def merge(per_rank: list[dict], path: str, metadata: dict | None = None) -> str:
    """Write one Chrome trace (JSON object format; gzip when path ends .gz) atomically; return path."""
    if not per_rank:
        raise ValueError("merge: no ranks given; pass the list of RankTracer.stop() results")
    evs: list[dict] = []
    for r in sorted(per_rank, key=lambda r: r["rank"]):
        evs += _names(r)
        evs += r["events"]
    evs += flow_events(per_rank)
    meta = dict(metadata or {})
    meta.setdefault("format", "partui-trace/1")
    meta.setdefault("ranks", sorted(r["rank"] for r in per_rank))
    meta.setdefault("coords", {str(r["rank"]): r.get("coords", "") for r in per_rank})
    meta.setdefault("window_us", [min(r["t0_us"] for r in per_rank), max(r["t1_us"] for r in per_rank)])
    doc = {"traceEvents": evs, "displayTimeUnit": "ms", "metadata": meta}
    write_atomic(path, doc)
    return path


def write_atomic(path: str, doc: dict) -> None:
    """Temp file in the same directory, fsync, os.replace: a failure leaves `path` as it was."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".partial-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as raw:
            if path.endswith(".gz"):
                with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=5) as gz:
                    _dump(doc, gz)
            else:
                _dump(doc, raw)
            raw.flush()
            os.fsync(raw.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a trace is for sharing
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _dump(doc: dict, binary_file) -> None:
    # raw UTF-8, not \u escapes: Perfetto's JSON importer keeps escapes literally in names
    text = json.dumps(doc, separators=(",", ":"), default=str, ensure_ascii=False)
    binary_file.write(text.encode("utf-8"))
