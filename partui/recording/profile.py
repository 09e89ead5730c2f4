"""`partui run --profile DIR`: each rank recorded by torch.profiler into one Kineto file, DIR/rank-N.json.

The files are what a GPU user brings from a cluster, so `partui report DIR`, HTA (a folder of
per-rank files, each with distributedInfo rank and world_size) and Perfetto all read them.
partui's own spans run inside `record_function` ranges of the same names while they run (the
region hook of kernels.comm.events, so kernels/ never imports the profiler), and again at their
own times on a track of their own (`at_own_times`), where the engine's step span is named
`ProfilerStep#N`, so each step window is exactly that step (the profiler's own `step()` would
also count the controller's time between steps). Each comm op's issue is an empty range named
`OP GROUP` whose args carry its op, group, bytes, peer and op id; its posting's end and its
completion are empty ranges `posted OP` and `done OP`, each with partui's own time of it. At export
each op's flight (issue to completion: what partui's traces call in flight) and its posting (issue
to posted: not compute) become ranges at those times (`comm_op_ranges`). Those ranges' args.partui is
their partui category (compute kinds, "wait", "post", "step", "comm"), which the reader's CPU path
classifies as partui's own traces do; the record_function ranges keep theirs as args.partui_range.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile, record_function

from kernels import comm
from kernels.comm import events
from partui.recording.tracefile import COMM_TID, assign_comm_lanes

TAG = " #~"  # joins a range's name to its args' key until export (Kineto writes names as given)


KINETO_LOG = ("USDT:", "STAGE:")   # Kineto's own progress lines (profiler_start, Warm Up, ...)


@contextlib.contextmanager
def without_kineto_log():
    """Kineto writes its progress lines (`USDT: ... profiler_start`) straight to fd 2 from C++, and
    no setting of its log level turns them off on CPU: fd 2 goes to a file meanwhile, and every
    other line written then is passed on afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [ln for ln in caught.read().splitlines(True)
                    if not ln.startswith(tuple(k.encode() for k in KINETO_LOG))]
            if kept:
                os.write(2, b"".join(kept))


def rank_file(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank-{rank}.json")


class RankProfile:
    """One rank's torch.profiler: `start()`, run steps, `stop() -> path` of its file."""

    def __init__(self, folder: str, rank: int, world_size: int):
        self.folder, self.rank, self.world_size = folder, int(rank), int(world_size)
        self._args: dict[str, dict] = {}  # TAG-keyed range name -> its args, joined at export
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        # every thread: the EP overlap's all-to-alls are posted from partui's comm thread
        # (kernels/comm/poster.py), which the profiler's thread-local callbacks would miss
        self.profiler = profile(activities=activities, record_shapes=True,
                             experimental_config=_ExperimentalConfig(profile_all_threads=True))

    def region(self, name: str, cat: str, args: dict):
        """The region hook: a record_function named `name`, its cat and args kept for export."""
        key = f"{name}{TAG}{len(self._args)}"
        self._args[key] = (cat, args)   # args gets t_ns / t_end_ns when the region ends
        return record_function(key)

    def start(self) -> "RankProfile":
        with without_kineto_log():
            self.profiler.start()
        events.set_regions(self.region)
        return self

    def stop(self) -> str:
        """Uninstall, export and write DIR/rank-N.json atomically (a half-written file never
        replaces a good one); returns its path."""
        events.set_regions(None)
        with without_kineto_log():
            self.profiler.stop()
        fd, raw = tempfile.mkstemp(dir=self.folder, prefix=f".rank-{self.rank}-", suffix=".tmp")
        os.close(fd)
        try:
            self.profiler.export_chrome_trace(raw)
            with open(raw) as f:
                doc = json.load(f)
            self.finish(doc)
            with open(raw, "w") as f:
                json.dump(doc, f)
            os.replace(raw, rank_file(self.folder, self.rank))
        finally:
            if os.path.exists(raw):
                os.remove(raw)
        return rank_file(self.folder, self.rank)

    def finish(self, doc: dict) -> None:
        """Ranges get back their plain names and their args; distributedInfo names the rank
        (torch writes it when torch.distributed is up; a world of one may not have it)."""
        ours = []
        for e in doc.get("traceEvents", []):
            name = e.get("name")
            if isinstance(name, str) and TAG in name and name in self._args:
                cat, args = self._args[name]
                e["name"] = name.split(TAG, 1)[0]
                e["args"] = {**e.get("args", {}), "partui": cat,
                             **{k: v for k, v in args.items() if _plain(v)}}
                ours.append(e)
        doc["traceEvents"] += comm_op_ranges(ours) + at_own_times(ours)
        info = doc.get("distributedInfo") or {"backend": comm.default_backend()}
        doc["distributedInfo"] = {**info, "rank": self.rank, "world_size": self.world_size}


def comm_op_ranges(trace_events: list) -> list[dict]:
    """What partui's traces record of each comm op, from its marks (matched by op_id): its flight,
    issue to completion, named `OP GROUP` with args.partui "comm", its op, group, bytes and peer;
    and the caller's time posting it, issue to posted, `post OP` with args.partui "post" (neither
    compute nor overlap). The times are partui's own (perf_counter, the marks' args.t_ns) put on the
    profiler's clock (`clock_offset`). Each kind on lanes of its
    own (no slice overlapping another on one lane, as in a partui trace), named by thread_name."""
    marks: dict[str, dict] = {"issue": {}, "done": {}, "posted": {}}
    for e in trace_events:
        args = e.get("args") or {}
        if e.get("ph") == "X" and args.get("partui") in marks and "t_mark_ns" in args:
            marks[args["partui"]].setdefault(args.get("op_id"), e)
    made = [e for kind in marks.values() for e in kind.values()]
    if not made:
        return []
    offset_ns = clock_offset(made)
    out = []
    for base, kind, end_kind, name in ((0, "comm", "done", "{name}"),
                                       (100, "post", "posted", "post {op}")):
        ranges = []
        for op_id, e in marks["issue"].items():
            end = marks[end_kind].get(op_id)
            if end is None:              # completed (or posted) after the profile stopped
                continue
            t0, t1 = e["args"]["t_ns"], max(e["args"]["t_ns"], end["args"]["t_ns"])
            ranges.append({"ph": "X", "cat": "user_annotation", "pid": e["pid"],
                           "name": name.format(name=e["name"], op=e["args"].get("op")),
                           "ts": (t0 + offset_ns) / 1000, "dur": (t1 - t0) / 1000,
                           "args": {**e["args"], "partui": kind}})
        lanes = assign_comm_lanes(ranges)
        for r in ranges:
            r["tid"] += base
        out += ranges + [{"ph": "M", "name": "thread_name", "pid": made[0]["pid"],
                          "tid": COMM_TID + base + i, "args": {"name": f"partui {kind} {i + 1}"}}
                         for i in range(lanes)]
    return out


def at_own_times(ranges: list[dict]) -> list[dict]:
    """partui's spans and waits again at their own times (args t_ns / t_end_ns, as its trace
    records them), on the profiler's clock by the marks' offset, on a track of their own ("partui
    spans"; one that would cross its parent's end goes to "partui spans 2", as in a partui trace):
    these are what the reader counts. The profiler's edges can be late on a loaded core (a span's
    range measured up to 1 ms longer than the span on this 2-core machine), so the record_function
    ranges stay as recorded, around their aten ops, with their category as args.partui_range."""
    offset_ns = clock_offset(ranges)
    timed = [e for e in ranges if "t_end_ns" in e["args"] and "t_mark_ns" not in e["args"]]
    if offset_ns is None or not timed:
        return []
    out, stack = [], []
    for e in sorted(timed, key=lambda e: (e["args"]["t_ns"], e["args"]["t_ns"] - e["args"]["t_end_ns"])):
        t0, t1 = e["args"]["t_ns"], e["args"]["t_end_ns"]
        while stack and stack[-1] <= t0:
            stack.pop()
        nests = not stack or t1 <= stack[-1]
        if nests:
            stack.append(t1)
        step = e["args"].get("step") if e["args"]["partui"] == "step" else None
        out.append({**e, "tid": OWN_TID if nests else OWN_TID + 1, "ts": (t0 + offset_ns) / 1000,
                    "dur": (t1 - t0) / 1000, "args": dict(e["args"]),
                    "name": e["name"] if step is None else f"ProfilerStep#{step}"})
    for e in timed:
        e["args"]["partui_range"] = e["args"].pop("partui")
    return out + [{"ph": "M", "name": "thread_name", "pid": out[0]["pid"], "tid": OWN_TID + i,
                   "args": {"name": "partui spans" + (" 2" if i else "")}} for i in range(2)]


OWN_TID = 200  # the tracks of partui's spans at their own times (comm lanes are 2..., posts 102...)


def clock_offset(ranges: list[dict]) -> int | None:
    """The profiler's clock less partui's, in ns: the smallest gap between a mark's start and the
    moment it was made (a mark is late by its own cost, never early); without marks the largest
    between a span's range start and its own start (the range opens just before it); None
    without either."""
    marks = [_ns(e["ts"]) - e["args"]["t_mark_ns"] for e in ranges if "t_mark_ns" in e["args"]]
    if marks:
        return min(marks)
    spans = [_ns(e["ts"]) - e["args"]["t_ns"] for e in ranges if "t_end_ns" in e["args"]]
    return max(spans) if spans else None


def _ns(us: float) -> int:
    return round(us * 1000)


def _plain(v) -> bool:
    return isinstance(v, (int, float, str, bool)) or v is None
