"""The entry point of a rank process (partui.world starts it): runs partui.rank's loop and reports a
failure before the loop to the controller. Light to import, so the controller never loads torch."""
from __future__ import annotations

import sys
import threading
import time
import traceback


HEARTBEAT_S = 0.5      # how often a rank stamps its slot of the controller's heartbeat array


def _beat(beats, rank: int) -> None:
    while True:
        beats[rank] = time.monotonic()    # CLOCK_MONOTONIC: one clock for every process
        time.sleep(HEARTBEAT_S)


def worker_main(rank: int, world: int, conn, opts: dict, beats=None) -> None:
    """Process entry point (spawned by partui.world). `beats`: a shared array the rank stamps from
    a thread while the process runs, so a stopped or frozen rank is told from a slow one."""
    if beats is not None:
        beats[rank] = time.monotonic()
        threading.Thread(target=_beat, args=(beats, rank), daemon=True, name="heartbeat").start()
    try:
        # lazy: rank-only code (torch, the engine); the fork server has preloaded it already
        from partui.rank import serve
        serve(rank, world, conn, opts)
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        pass  # the controller went away: exit quietly
    except BaseException as e:  # noqa: BLE001 - a failure before the loop: report and exit
        try:
            conn.send(("error", {"rank": rank, "error": f"{type(e).__name__}: {e}",
                                 "traceback": traceback.format_exc()}))
        except Exception:  # noqa: BLE001
            pass
        sys.exit(1)
