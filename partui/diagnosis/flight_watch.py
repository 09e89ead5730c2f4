"""The rank side of the flight recorder: a watcher thread that publishes where the rank is (the
time its current blocking wait began, the time of its last issued op) into the controller's shared
`watch` array, and writes this rank's records to FOLDER/rank-N.json whenever the controller asks
(its request counter moves). A thread, because a hung rank's main thread never returns to answer.

watch layout (int64): [request, then per rank: waiting_since_ns, last_issue_ns, served_request,
then per rank a block of mirrored op rows (planning/flight_codes.py), which outlive the rank].
"""
from __future__ import annotations

import json
import os
import threading
import time

from kernels.comm import flight
from planning.flight_codes import BLOCK

WATCH_S = 0.2     # how often the watcher publishes (the controller polls every second)
SLOTS = 3         # per rank in the watch array


def start(rank: int, world: int, watch, folder: str) -> threading.Thread:
    flight.recorder.attach_mirror(watch, 1 + SLOTS * world + rank * BLOCK)
    t = threading.Thread(target=_loop, args=(rank, watch, folder), daemon=True, name="flight")
    t.start()
    return t


def _loop(rank: int, watch, folder: str) -> None:
    base = 1 + SLOTS * rank
    while True:
        fr = flight.recorder
        # the recorder off (partui bench flight): never blocked, so never named as stopped
        watch[base] = fr.waiting_since() if fr.enabled else 0
        ring = fr.ring
        try:
            watch[base + 1] = ring[-1].t_issue if ring else 0
        except IndexError:          # cleared between the test and the read
            pass
        asked = watch[0]
        if asked != watch[base + 2]:
            write_dump(rank, folder)
            watch[base + 2] = asked
        time.sleep(WATCH_S)


def write_dump(rank: int, folder: str) -> str:
    """This rank's records, written whole or not at all (a temp file renamed)."""
    path = os.path.join(folder, f"rank-{rank}.json")
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(flight.dump(rank, time.perf_counter_ns()), f)
    os.replace(tmp, path)
    return path
