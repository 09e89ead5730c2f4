"""The entry points of a rank process (partui.launch starts them): a held rank runs partui.rank's
command loop, a one-shot rank runs one fn; a failure outside the loop is reported to the launcher
with the rank and its traceback. Light to import, so the launcher never loads torch."""
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


def error_reply(rank: int, e: BaseException) -> tuple:
    """The one form of a rank's failure, the launcher's RankError on the other side."""
    return ("error", {"rank": rank, "error": f"{type(e).__name__}: {e}",
                      "traceback": traceback.format_exc()})


def _report(conn, rank: int, e: BaseException) -> None:
    try:
        conn.send(error_reply(rank, e))
    except Exception:  # noqa: BLE001 - the launcher is gone: nobody to tell
        pass


def worker_main(rank: int, world: int, conn, rendezvous: bool, opts: dict, beats=None) -> None:
    """A held rank (forked by partui.launch's fork server). `beats`: a shared array the rank stamps
    from a thread while the process runs, so a stopped or frozen rank is told from a slow one."""
    if beats is not None:
        beats[rank] = time.monotonic()
        threading.Thread(target=_beat, args=(beats, rank), daemon=True, name="heartbeat").start()
    try:
        # lazy: rank-only code (torch, the engine); the fork server has preloaded it already
        from partui.rank import serve
        serve(rank, world, conn, rendezvous, opts)
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        pass  # the controller went away: exit quietly
    except BaseException as e:  # noqa: BLE001 - a failure before the loop: report and exit
        _report(conn, rank, e)
        sys.exit(1)


def one_shot_main(rank: int, size: int, conn, rendezvous: bool, fn, args: tuple,
                  timeout_s: float) -> None:
    """A one-shot rank (forked by partui.launch.run_world): fn's result (partui.rank.run_once
    sends it), or its failure, to the launcher."""
    try:
        from partui.rank import run_once    # lazy, as above
        run_once(rank, size, conn, rendezvous, fn, args, timeout_s)
    except BaseException as e:  # noqa: BLE001 - every failure goes to the launcher
        _report(conn, rank, e)
