"""The app's Routing tab: a DeepSeek world stepped in the app draws the heatmap and the
max-violation sparkline from the same step lines `partui run --json` prints."""
import pytest

from partui.app.widgets.routing_map import render
from app_helpers import idle, launched
from test_app import SIZE, assert_no_process

pytestmark = pytest.mark.timeout(300)


async def test_deepseek_world_draws_its_routing():
    from partui.app.main import PartuiApp
    from partui.app.widgets.inspector import TABS, Inspector
    from partui.app.widgets.routing_map import RoutingMap
    app = PartuiApp()
    async with app.run_test(size=SIZE) as pilot:
        pids = await launched(app, pilot, "plan deepseek")
        await pilot.press("escape")              # leave the command line: `s` is a key, not text
        for _ in range(2):
            await pilot.press("s")
            await pilot.pause(0.05)
            await idle(app, pilot, "a step")
        lines = app.world.history
        assert len(lines) == 2 and all("moe_layers" in ln for ln in lines)
        app.screen.query_one(Inspector).active = TABS["routing"]
        await pilot.pause(0.2)
        shown = str(app.screen.query_one(RoutingMap).shown)
        assert shown == str(render(lines))
        assert "step 1:" in shown and shown.count("\nL") == len(lines[-1]["moe_layers"])
        for fig in lines[-1]["moe_layers"].values():
            assert f"max viol {fig['max_violation']:.3f}" in shown
            assert f"bias [{min(fig['bias']):+.4f}, {max(fig['bias']):+.4f}]" in shown
        assert "last 2 steps" in shown
        await pilot.press("escape", "q")
    assert_no_process(pids)
