"""The entry points of a rank process (partui.world.launch starts them): a held rank runs partui.world.rank's
command loop, a one-shot rank runs one fn; partui.world.rank reports every failure to the launcher with
the rank and its traceback. Light to import, so the launcher never loads torch."""
from __future__ import annotations

import threading
import time

HEARTBEAT_S = 0.5      # how often a rank stamps its slot of the controller's heartbeat array


def _beat(beats, rank: int) -> None:
    while True:
        beats[rank] = time.monotonic()    # CLOCK_MONOTONIC: one clock for every process
        time.sleep(HEARTBEAT_S)


def worker_main(rank: int, world: int, conn, rendezvous: bool, opts: dict, beats=None,
                watch=None) -> None:
    """A held rank (forked by partui.world.launch's fork server). `beats`: a shared array the rank stamps
    from a thread while the process runs, so a stopped or frozen rank is told from a slow one;
    `watch`: the flight recorder's shared array (partui.diagnosis.flight_watch publishes into it)."""
    if beats is not None:
        beats[rank] = time.monotonic()
        threading.Thread(target=_beat, args=(beats, rank), daemon=True, name="heartbeat").start()
    try:
        # lazy: rank-only code (torch, the engine); the fork server has preloaded it already
        from partui.world.rank import serve
        serve(rank, world, conn, rendezvous, opts, watch)
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        pass  # the controller went away: exit quietly


def one_shot_main(rank: int, size: int, conn, rendezvous: bool, fn, args: tuple,
                  timeout_s: float) -> None:
    """A one-shot rank (forked by partui.world.launch.run_world): partui.world.rank.run_once sends fn's
    result, or its failure, to the launcher."""
    from partui.world.rank import run_once  # lazy, as above
    run_once(rank, size, conn, rendezvous, fn, args, timeout_s)
