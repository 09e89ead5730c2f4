"""The controller side of tracing: windows stitched per rank, send->recv flow arrows, process and
thread names, and one Chrome trace written atomically (opens in Perfetto; `partui report` reads it).
Pure Python, light to import; the rank side is partui.recording.trace.

Tracks (tids) per rank: 1 compute, 2.. comm lanes (in-flight comm ops overlap each other, so each
lane holds non-overlapping ones; assigned here, after sends are ended at their recv's completion),
1000+ compute overflow, 2000+ viztracer threads. p2p: `p2p_pairs`, `fit_p2p_slices` (a pair
is in flight from the send's post to the recv's completion), `transfer_times` (a pair's measured
transfer, where the receiver was already waiting), `bind_flows` (send -> recv arrows).
"""
from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
import time

from planning.intervals import match_p2p, paired_spans

COMPUTE_TID = 1
COMM_TID = 2  # lanes COMM_TID, COMM_TID + 1, ...; names "comm", "comm 2", ...
COMPUTE_OVERFLOW_TID = 1000
GC_TID = 1500  # the cyclic GC's collections (partui.recording.trace): a pause of the whole rank, no figure's
PY_TID = 2000
P2P_OPS = ("send", "recv")
TIE_US = 0.001  # one nanosecond: Perfetto keeps time in ns
FORMAT = "partui-trace/1"


def stitch(windows: list[list[dict]]) -> list[dict]:
    """One entry per rank from recorded windows (each a list of RankTracer.stop() results in rank
    order): events concatenated, t0_us from the first window, t1_us from the last."""
    if not windows:
        raise ValueError("stitch: no windows recorded; start and stop the tracer around a step first")
    per_rank = [dict(ev) for ev in windows[0]]
    for chunk in windows[1:]:
        for r, ev in enumerate(chunk):
            per_rank[r]["events"] = per_rank[r]["events"] + ev["events"]
            per_rank[r]["t1_us"] = ev["t1_us"]
    return per_rank


def assign_comm_lanes(ops: list[dict]) -> int:
    """Give one rank's comm slices their tids in place: greedy interval colouring in issue order,
    the first lane free at issue time, so slices on one lane never overlap. Returns lanes used."""
    lane_end: list[float] = []
    for e in sorted(ops, key=lambda e: (e["ts"], e["ts"] + e["dur"])):
        t0, t1 = e["ts"], e["ts"] + e["dur"]
        lane = next((i for i, end in enumerate(lane_end) if end <= t0), len(lane_end))
        if lane == len(lane_end):
            lane_end.append(t1)
        lane_end[lane] = t1
        e["tid"] = COMM_TID + lane
    return len(lane_end)


def p2p_pairs(per_rank: list[dict]) -> list[tuple[dict, dict]]:
    """(send, recv) slices, matched across ranks by planning.intervals.match_p2p."""
    slices = [e for r in per_rank for e in r["events"]
              if e.get("cat") == "comm" and (e.get("args") or {}).get("op") in P2P_OPS
              and e["args"].get("peer") is not None]
    ops = [(e["args"]["op"], e["pid"], int(e["args"]["peer"]), e["args"].get("tag", 0), e["ts"])
           for e in slices]
    return [(slices[s], slices[r]) for s, r in match_p2p(ops)]


def fit_p2p_slices(pairs: list[tuple[dict, dict]]) -> None:
    """Each pair's slices cut to its time in flight (planning.intervals.paired_spans: the send's
    post to the recv's completion). A send ended at its recv's completion says so (args.end
    "recv"); a recv posted before its send starts just after the send's post (args.posted_early_us
    says by how much), the rank blocked meanwhile showing as its wait. Both sides then begin send
    first, which is also what Perfetto needs to draw the arrow send -> recv."""
    for s, r in pairs:
        (s0, s1), (r0, r1), send_cut, recv_early = paired_spans(
            (s["ts"], s["ts"] + s["dur"]), (r["ts"], r["ts"] + r["dur"]), TIE_US)
        if send_cut:
            s["dur"] = s1 - s0
            s["args"] = dict(s.get("args") or {}, end="recv")
            s["args"].pop("unfinished", None)
        if recv_early:
            r["args"] = dict(r.get("args") or {}, posted_early_us=round(r0 - r["ts"], 3))
            r["ts"], r["dur"] = r0, r1 - r0


def transfer_times(per_rank: list[dict], pairs: list[tuple[dict, dict]]) -> None:
    """args.transfer_us on each recv slice whose rank was already waiting for it when the send's post
    returned: the send's post to the recv's completion, the bytes' own transfer time (elsewhere the
    completion is only when the receiver looked). The pipeline simulator's per-edge latency."""
    posts, waits = {}, {}
    for r in per_rank:
        for e in r["events"]:
            op_id = (e.get("args") or {}).get("op_id")
            if op_id is not None and e.get("cat") in ("post", "wait"):
                (posts if e["cat"] == "post" else waits)[(e["pid"], op_id)] = e
    for s, r in pairs:
        post = posts.get((s["pid"], (s.get("args") or {}).get("op_id")))
        wait = waits.get((r["pid"], (r.get("args") or {}).get("op_id")))
        if post is not None and wait is not None and wait["ts"] <= post["ts"] + post["dur"]:
            r["args"] = dict(r.get("args") or {}, transfer_us=round(r["ts"] + r["dur"] - s["ts"], 3))


def bind_flows(pairs: list[tuple[dict, dict]]) -> None:
    """One arrow per pair from the send slice to the recv slice, bound to the slices themselves
    (Chrome's bind_id with flow_out / flow_in): the older s / f events bind to whatever slice is
    open at their time, which put arrows on stale slices and drew some recv -> send."""
    for flow_id, (s, r) in enumerate(pairs, start=1):
        s.update(bind_id=flow_id, flow_out=True)
        r.update(bind_id=flow_id, flow_in=True)


def process_metadata(r: dict) -> list[dict]:
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
        elif tid == GC_TID:
            name = "gc"
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
    write_atomic(path, build_doc(per_rank, metadata))
    return path


def build_doc(per_rank: list[dict], metadata: dict | None = None) -> dict:
    """The Chrome trace document of RankTracer.stop() results (what `merge` writes)."""
    if not per_rank:
        raise ValueError("merge: no ranks given; pass the list of RankTracer.stop() results")
    per_rank = [dict(r, events=[dict(e) for e in r["events"]]) for r in per_rank]  # callers' stay
    pairs = p2p_pairs(per_rank)
    fit_p2p_slices(pairs)
    transfer_times(per_rank, pairs)
    bind_flows(pairs)
    evs: list[dict] = []
    for r in sorted(per_rank, key=lambda r: r["rank"]):
        assign_comm_lanes([e for e in r["events"] if e.get("cat") == "comm" and e.get("ph") == "X"])
        evs += process_metadata(r)
        evs += r["events"]
    meta = dict(metadata or {})
    meta.setdefault("format", FORMAT)
    meta.setdefault("ranks", sorted(r["rank"] for r in per_rank))
    meta.setdefault("coords", {str(r["rank"]): r.get("coords", "") for r in per_rank})
    meta.setdefault("window_us", [min(r["t0_us"] for r in per_rank), max(r["t1_us"] for r in per_rank)])
    return {"traceEvents": evs, "displayTimeUnit": "ms", "metadata": meta}


def write_atomic(path: str, doc: dict) -> None:
    """Temp file in the same directory, fsync, os.replace: a failure leaves `path` as it was."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    remove_stale_partials(folder)
    fd, tmp = tempfile.mkstemp(prefix=f".partial-{os.getpid()}-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as raw:
            if path.endswith(".gz"):
                with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=5) as gz:
                    dump(doc, gz)
            else:
                dump(doc, raw)
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


PARTIAL = re.compile(r"^\.partial-(?:(\d+)-)?\w+\.tmp$")
STALE_S = 3600.0     # a partial file without a pid (older partui) counts as stale after an hour


def remove_stale_partials(folder: str) -> list[str]:
    """Delete the `.partial-PID-*.tmp` files a hard-killed writer left in `folder` (its PID no longer
    runs; an unnamed one once it is an hour old). Returns the paths removed."""
    removed = []
    for name in os.listdir(folder):
        m = PARTIAL.match(name)
        if not m:
            continue
        full = os.path.join(folder, name)
        try:
            stale = (not _running(int(m.group(1))) if m.group(1)
                     else time.time() - os.path.getmtime(full) > STALE_S)
            if stale:
                os.unlink(full)
                removed.append(full)
        except OSError:
            continue       # another writer finished or removed it first
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def dump(doc: dict, binary_file) -> None:
    # raw UTF-8, not \u escapes: Perfetto's JSON importer keeps escapes literally in names
    text = json.dumps(doc, separators=(",", ":"), default=str, ensure_ascii=False)
    binary_file.write(text.encode("utf-8"))
