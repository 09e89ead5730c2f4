"""The entry point of a rank process (partui.world starts it): runs partui.rank's loop and reports a
failure before the loop to the controller. Light to import, so the controller never loads torch."""
from __future__ import annotations

import sys
import traceback


def worker_main(rank: int, world: int, conn, opts: dict) -> None:
    """Process entry point (spawned by partui.world)."""
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
