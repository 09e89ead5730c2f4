"""The one way tests start a multi-process gloo world.

    from worlds import run_world
    results = run_world(2, fn, arg, timeout_s=150)   # fn(rank, size, arg) on 2 forked ranks

or, as a fixture, `def test_x(gloo_world): gloo_world(2, fn, arg)` (tests/conftest.py).

Results come back in rank order. Every world has a deadline, so a deadlock fails the test with
the ranks that gave no result instead of hanging it; the rendezvous port is picked by the OS
(never fixed), so worlds started side by side never race for a port. A rank's exception comes
back as a RankError (a RuntimeError) carrying its traceback, a deadline as a WorldTimeout naming the
ranks that gave no result, and no rank process outlives the call.

It is the one launcher's one-shot mode (partui.world.launch.run_world, which the benches use too) with
a deadline every test world must have; no test starts rank processes any other way.
"""
from __future__ import annotations

import math

from partui.world import launch

DEFAULT_TIMEOUT_S = 120.0


def run_world(size: int, fn, *args, timeout_s: float = DEFAULT_TIMEOUT_S, what: str = "",
              fix: str = launch.MORE_TIME) -> list:
    """fn(rank, size, *args) on `size` forked gloo ranks; their results in rank order.

    `what` names the world in errors (default: "<size>-rank world of <fn>"); `fix` is what a
    timeout error suggests. fn and args need no pickling (the ranks are forked)."""
    if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s and math.isfinite(timeout_s)):
        raise ValueError(f"run_world: timeout_s {timeout_s!r}: every test world needs a finite "
                         f"deadline in seconds, so a deadlock fails instead of hanging")
    what = what or f"{size}-rank world of {getattr(fn, '__name__', fn)}"
    return launch.run_world(size, fn, *args, timeout_s=timeout_s, what=what, fix=fix)
