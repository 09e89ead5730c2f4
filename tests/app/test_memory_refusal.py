"""`:plan single dim=100000` in the app: the plan's estimated memory is refused as an error toast
naming the estimate and a fix, before anything is built, and the running world stays as it was."""
import pytest

from app_helpers import command, idle, launched, wait_for
from partui.app.screens.run import RunScreen

pytestmark = pytest.mark.timeout(200)


async def test_a_plan_too_big_for_this_machine_leaves_the_world_running():
    from partui.app.main import PartuiApp
    app = PartuiApp()
    async with app.run_test(size=(120, 40)) as pilot:
        pids = await launched(app, pilot, "plan zero2 dp=2")
        plan, screen = app.world.current_plan, app.screen
        seen = []
        app.notify = lambda msg, **kw: seen.append((msg, kw.get("title"), kw.get("severity")))
        await command(app, pilot, "plan single dim=100000")
        await idle(app, pilot, "the refused plan")
        await wait_for(pilot, lambda: seen, what="the refusal")
        msg, title, severity = seen[-1]
        assert (title, severity) == ("invalid plan", "error")
        assert msg.startswith("this plan needs an estimated ") and ": try dim=" in msg, msg
        assert app.world.launched and app.world.pids() == pids
        assert app.world.current_plan is plan and app.screen is screen
        assert isinstance(app.screen, RunScreen)
        await pilot.press("escape", "q")
