"""Issue 35 item 6, a step in flight: after a `:` command the keys are the screen's again (`s`
steps), a slow step says "stepping… N s" on the status line (the cards may be hidden), and `q`
during it leaves at once, its ranks stopped, instead of waiting for the step to end (the screen
froze ~11 s under `link h800`). A failed launch leaves the old world on show, status and tabs
alike."""
import time

import pytest

from app_helpers import command, idle, launched, wait_for

pytestmark = pytest.mark.timeout(200)
SLOW_STEP_S = 30.0   # the straggler's step, at least: far longer than a quit may take


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie, gone but not reaped, counts as stopped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_focus_returns_stepping_shows_and_q_stops_a_step_in_flight():
    from partui.app.main import PartuiApp
    from textual.widgets import Input
    app = PartuiApp()
    async with app.run_test(size=(80, 24)) as pilot:
        pids = await launched(app, pilot, "plan single")
        assert not isinstance(app.focused, Input)     # the plan command gave the keys back
        await pilot.press("s")                        # so `s` steps, not typed
        await wait_for(pilot, lambda: app.world.steps_done == 1, what="the first step")
        await idle(app, pilot)
        compute_ms = app.world.history[-1]["ranks"][0]["compute_ms"]
        factor = max(2.0, 1e3 * SLOW_STEP_S / max(compute_ms, 1.0))
        await command(app, pilot, f"slow 0={factor:.0f}")
        await idle(app, pilot, "slow")
        assert not isinstance(app.focused, Input) and app.world.slowed["factor"] == round(factor)
        await pilot.press("s")
        status = app.screen.query_one("#run-status")
        await wait_for(pilot, lambda: "stepping… " in str(status.render()), timeout=20,
                       what="the stepping indicator")
        assert app.busy and app.world.steps_done == 1
        t0 = time.monotonic()
        await pilot.press("q")
        await pilot.pause(0.05)
        assert "quitting: stopping the ranks" in str(status.render())
        await wait_for(pilot, lambda: not app.is_running, timeout=SLOW_STEP_S / 2, what="q to quit")
        took = time.monotonic() - t0
    assert took < SLOW_STEP_S / 2, took
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "a rank outlived the app"


async def test_a_failed_launch_leaves_the_old_world_on_show():
    from partui.app.main import PartuiApp
    from partui.app.screens.dialogs import ErrorDialog
    app = PartuiApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await launched(app, pilot, "plan single")
        await pilot.press("7")                        # the Memory tab
        await pilot.pause(0.1)
        status, memory = app.screen.query_one("#run-status"), app.screen.query_one("#memory-map")
        before = str(memory.render())
        timeout_s, app.world.timeout_s = app.world.timeout_s, 1e-3   # no rank answers in time
        await command(app, pilot, "plan zero2 dp=2")
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the failure")
        await idle(app, pilot, "the failed launch")
        app.world.timeout_s = timeout_s
        await pilot.press("escape")
        await pilot.pause(0.2)
        shown = str(status.render())
        assert "single · 1 rank" in shown and "dp 2" not in shown, shown
        assert app.world.current_plan.world == 1 and str(memory.render()) == before
        assert "world closed: x (reset) relaunches" in shown
        await pilot.press("x")                        # the old world again
        await wait_for(pilot, lambda: app.world.launched, what="the relaunch")
        await idle(app, pilot, "the relaunch")
        assert app.world.current_plan.world == 1
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, timeout=20, what="q to quit")
