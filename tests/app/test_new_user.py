"""The app as a new user meets it (issue 20), driven by Textual's Pilot: each gradient's own piece,
a leading `:` accepted, keys typed into the command line never firing bindings, tab keys, the setup
form showing the running plan, `t` off keeping the trace and the report saying whose trace it is."""
import os

import pytest

from app_helpers import command, engine_ready, idle, trace_one_step, wait_for
from partui.app.screens.commands import CommandsProvider
from partui.app.widgets.command_line import EXAMPLES, CommandError, parse
from partui.world.plans import PRESETS

pytestmark = pytest.mark.timeout(300)


def test_leading_colon_and_plan_field_hint():
    assert parse(":trace on").args == {"action": "on"}
    assert parse("  :step 3").args == {"n": 3}
    with pytest.raises(CommandError, match="e.g. `dp=3`"):
        parse("plan zero2 dp=banana")
    with pytest.raises(CommandError, match="e.g. `step 3`"):
        parse("step banana")
    assert parse("show rank 1 shards layers.0").args == {"rank": 1, "what": "shards",
                                                         "name": "layers.0"}
    assert parse("show rank 0 trace").args["what"] == "trace"


def test_palette_entries_say_what_they_do():
    commands = CommandsProvider.commands(None)
    assert set(EXAMPLES) <= set(commands)
    assert {f"plan {p}" for p in PRESETS if p != "custom"} <= set(commands)
    helps = list(commands.values())
    assert all(h and h != "partui command" for h in helps)
    assert len(set(helps)) == len(helps), "two palette entries read the same"


async def test_new_user_journey():
    from partui.app.main import PartuiApp
    from partui.app.screens.run import RunScreen
    from partui.app.widgets.command_line import CommandLine
    from partui.app.widgets.inspector import TABS, Inspector
    from textual.widgets import Input
    app = PartuiApp()
    saved = []
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await engine_ready(app, pilot)
            await command(app, pilot, ":plan zero2 dp=2")
            await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")
            await idle(app, pilot)
            # a command gives the keys back (issue 35); `:` takes them again, and then `step 3`
            # typed is text, not s / t / p bindings
            assert not isinstance(app.focused, CommandLine)
            await pilot.press(":")
            await pilot.pause(0.1)
            assert isinstance(app.focused, CommandLine)
            await pilot.press(*"step 3")
            await pilot.pause(0.2)
            assert isinstance(app.screen, RunScreen) and not app.busy and not app.world.history
            assert app.focused.value == "step 3"
            await pilot.press("enter")
            await pilot.pause(0.05)
            await idle(app, pilot, "three steps")
            await wait_for(pilot, lambda: len(app.inspect_ms) == 1, what="the inspector refresh")
            assert len(app.world.history) == 3 and not isinstance(app.focused, CommandLine)

            # Grads: each gradient's own piece; ZeRO-2 rank 1 holds flat shards
            await command(app, pilot, ":show rank 1 grads")
            await pilot.pause(0.2)
            insp = app.screen.query_one(Inspector)
            assert app.screen.selected == 1 and insp.active == TABS["grad"]
            grads = {r[0]: r[1] for r in insp.rows("grad")}
            await command(app, pilot, "show rank 1 optim")
            await pilot.pause(0.2)
            optim = {r[0]: r[1] for r in insp.rows("optim")}
            assert optim and all(v.startswith("flat [") for v in optim.values())
            # the oracle: ZeRO-2 shards grads exactly as it shards optimizer state
            assert {n: v for n, v in grads.items() if v != "not held here"} == optim
            assert "whole" not in grads.values()
            held = sum(1 for v in grads.values() if v != "not held here")
            assert 0 < held < len(grads), "ZeRO-2 over 2 ranks: rank 1 holds some grads, not all"
            not_held = [r for r in insp.rows("grad") if r[1] == "not held here"]
            assert all(r[2:] == ["—", "—", "—"] for r in not_held)
            # the shard map follows the Grads tab: each rank's gradient piece of the row
            name = next(n for n, v in grads.items() if v != "not held here")
            await command(app, pilot, f"show rank 1 grad {name}")
            await pilot.press("escape", "4")
            await pilot.pause(0.3)
            shard_map = str(app.screen.query_one("#shard-map").render())
            assert f"{name} " in shard_map and "· grads" in shard_map
            assert grads[name] in shard_map                   # rank 1's flat range, as the tab says

            # tab keys, outside the command line
            await pilot.press("escape")
            for key, what in zip("12345", TABS):
                await pilot.press(key)
                await pilot.pause(0.05)
                assert insp.active == TABS[what], key
            await command(app, pilot, "show rank 0 shards layers.0.attn.wq")
            await pilot.pause(0.2)
            assert insp.active == TABS["shards"] and app.screen.selected == 0
            assert "layers.0.attn.wq" in str(app.screen.query_one("#shard-map").render())

            # `t` on, a step, `t` off: the trace is kept, named automatically, shown in the panel
            panel = await trace_one_step(app, pilot)            # t off saves it
            path = app.world.trace_path
            saved.append(path)
            assert not app.world.recording and path and os.path.isfile(path)
            about = str(panel.query_one("#trace-path").render())
            assert path in about and "trace of dp 2 · ZeRO-2 · world 2 · step 3" in about
            assert "earlier" not in about
            # the trace tab's name input keeps its keys too: s, t, x, p are letters there
            steps = len(app.world.history)
            panel.query_one("#trace-name", Input).focus()
            await pilot.press(*"stxp")
            await pilot.pause(0.3)
            assert panel.query_one("#trace-name", Input).value == "stxp"
            assert len(app.world.history) == steps and not app.world.recording and not app.busy
            assert isinstance(app.screen, RunScreen)
            await pilot.press("escape")
            app.screen.set_focus(None)

            # `p`: the setup form shows the running plan, not the first preset
            await pilot.press("p")
            await pilot.pause(0.2)
            assert app.screen is app.setup_screen
            form = {k: app.setup_screen.query_one(f"#f-{k}", Input).value for k in ("dp", "zero")}
            assert form == {"dp": "2", "zero": "2"}

            # another plan, then `report`: the old trace says it is an earlier world's
            await command(app, pilot, "plan dp dp=2")
            await wait_for(pilot, lambda: isinstance(app.screen, RunScreen)
                           and app.world.current_plan.zero == 0 and not app.busy,
                           what="the dp world")
            await command(app, pilot, "report")
            panel = app.screen.query_one("#trace-panel")
            await wait_for(pilot, lambda: panel.report_rows("rank"), what="the stale report")
            about = str(panel.query_one("#trace-path").render())
            assert "trace of dp 2 · ZeRO-2" in about and "an earlier world's" in about
            await pilot.press("ctrl+c")
    finally:
        for p in saved:
            if p and os.path.isfile(p):
                os.remove(p)


async def test_setup_mesh_view_shows_each_rank_before_launch():
    """The setup form's plan, every rank as the world will build it, before anything launches."""
    from partui.app.main import PartuiApp
    from partui.app.screens.mesh import MeshScreen
    from textual.widgets import Input
    app = PartuiApp()
    async with app.run_test(size=(100, 30)) as pilot:
        await engine_ready(app, pilot)
        for key, value in (("dp", "2"), ("tp", "2"), ("pp", "2"), ("microbatches", "2")):
            app.setup_screen.query_one(f"#f-{key}", Input).value = value
        await pilot.pause(0.2)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.screen, MeshScreen) and app.screen.rows,
                       what="the mesh view")
        rows = app.screen.rows
        assert app.world.controller is None                      # nothing launched
        assert [r[:5] for r in rows[:3]] == [["0", "dp0 tp0 pp0", "0,2", "0,1", "0,4"],
                                             ["1", "dp0 tp1 pp0", "1,3", "0,1", "1,5"],
                                             ["2", "dp1 tp0 pp0", "0,2", "2,3", "2,6"]]
        assert len(rows) == 8
        roles = str(app.screen.query_one("#mesh-roles").render())
        assert "rank 7 (dp1 tp1 pp1): pp rank 1 of 2" in roles
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert app.screen is app.setup_screen
