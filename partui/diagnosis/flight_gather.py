"""The controller side of the flight recorder (torch-free): detect a world that stopped making
progress from what each rank's watcher publishes (partui/diagnosis/flight_watch.py), ask every rank for its
records, gather them into one dump and write it where `partui doctor DUMP` reads it later.

A world has stopped when some rank has been blocked in one wait for HANG_S and no rank has issued
an op for as long: a slow rank keeps issuing, a late one (a straggler) ends the wait sooner.
"""
from __future__ import annotations

import json
import os
import time

from partui.diagnosis.doctor import render, verdict
from planning.flight_codes import BLOCK, decode

HANG_S = 5.0        # blocked this long with nothing issued anywhere: stopped (diagnosed in < 10 s)
GATHER_S = 3.0      # how long the ranks' watchers get to write their records
SLOTS = 3           # per rank in the watch array (partui/diagnosis/flight_watch.py)


def watch_size(world: int) -> int:
    return 1 + SLOTS * world + BLOCK * world


def mirrored(watch, world: int, rank: int) -> dict:
    """A rank's last ops from its shared rows (all a dead rank leaves): no span, no wait."""
    at = 1 + SLOTS * world + rank * BLOCK
    records = decode(watch[at:at + BLOCK])
    return {"rank": rank, "step": records[-1]["step"] if records else None, "span": None,
            "waiting": None, "groups": {}, "records": records, "from": "shared memory"}


def stopped(watch, world: int, now_ns: int | None = None, hang_s: float = HANG_S) -> int | None:
    """The rank blocked longest, if the world has stopped making progress; else None."""
    now_ns = now_ns if now_ns is not None else time.perf_counter_ns()
    limit = hang_s * 1e9
    waits = {r: watch[1 + SLOTS * r] for r in range(world)}
    last_issue = max(watch[2 + SLOTS * r] for r in range(world))
    blocked = {r: now_ns - t for r, t in waits.items() if t and now_ns - t > limit}
    if not blocked or now_ns - last_issue <= limit:
        return None
    return max(blocked, key=blocked.get)


def gather(watch, world: int, folder: str, alive, reason: str, timeout_s: float = GATHER_S) -> dict:
    """Ask every rank for its records; the dump of those that answered by timeout_s. alive(r):
    whether rank r's process still runs (a dead one cannot answer)."""
    watch[0] += 1
    asked = watch[0]
    deadline = time.monotonic() + timeout_s
    pending = {r for r in range(world) if alive(r)}
    while pending and time.monotonic() < deadline:
        pending = {r for r in pending if watch[3 + SLOTS * r] != asked}
        time.sleep(0.05)
    ranks = []
    for r in range(world):
        path = os.path.join(folder, f"rank-{r}.json")
        if r in pending or not os.path.exists(path):
            continue
        with open(path) as f:
            ranks.append(json.load(f))
    for r in sorted(set(range(world)) - {rk["rank"] for rk in ranks}):
        if watch[1 + SLOTS * world + r * BLOCK]:       # it mirrored ops before it went quiet
            ranks.append(mirrored(watch, world, r))
    ranks.sort(key=lambda rk: rk["rank"])
    absent = [r for r in pending if r < world] + [r for r in range(world) if not alive(r)]
    return {"format": "partui-flight", "world": world, "reason": reason, "ranks": ranks,
            "absent": absent}


def write(dump: dict, path: str) -> str:
    """The dump at path, written whole or not at all."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.partial-{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(dump, f)
    os.replace(tmp, path)
    return path


def report(dump: dict, path: str | None) -> str:
    """The verdict's lines, and where the dump went."""
    lines = render(verdict(dump))
    if path:
        lines.append(f"flight dump: {path} (partui doctor {path})")
    return "\n".join(lines)
