"""The setup form never traps the keys (issue 28): escape leaves a field, `:`, `?` and `q` reach
the screen from a number field (never typed into it), the footer says how to leave, a number field
takes no more digits than its Plan field's upper bound (planning.mesh, le=) and a large number is
refused at once; `r` on the run screen toggles: run until `r` again."""
import time

import pytest

from app_helpers import command, engine_ready, idle, launched, wait_for
from planning import mesh
from partui.app.screens.setup import form_specs, input_names

pytestmark = pytest.mark.timeout(300)


def test_every_number_field_has_an_upper_bound_in_the_metadata():
    for spec in form_specs():
        if spec.name in input_names():
            assert spec.le is not None or spec.choices, spec.name
    with pytest.raises(mesh.PlanError, match=r"tp 3000 must be <= 1024"):
        mesh.Plan(tp=3000)
    from partui.app.widgets.number_input import range_text
    specs = {s.name: s for s in form_specs()}
    assert range_text(specs["tp"]) == "1 to 1024" and range_text(specs["zero"]) == "one of 0, 1, 2, 3"


async def test_a_command_typed_while_a_field_has_focus():
    from partui.app.main import PartuiApp
    from partui.app.screens.dialogs import HelpScreen
    from partui.app.widgets.command_line import CommandLine
    from textual.widgets import Input
    app = PartuiApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await engine_ready(app, pilot)
        setup = app.setup_screen
        tp = setup.query_one("#f-tp", Input)
        tp.focus()
        await pilot.pause()
        footer = "\n".join(s.text for s in app.screen._compositor.render_strips()[-2:])
        assert "esc leave field" in footer and ": command" in footer and "q quit" in footer
        # a large number answers at once: the field stops at 1024's four digits, the Plan refuses
        tp.value = ""
        t0 = time.monotonic()
        await pilot.press(*"300000")
        await pilot.pause(0.1)
        assert tp.value == "3000" and time.monotonic() - t0 < 3.0
        assert "tp 3000 must be <= 1024" in str(setup.query_one("#status").render())
        await pilot.press("?")                               # help, not a character in tp
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help screen")
        await pilot.press("escape")
        await pilot.pause(0.1)
        tp.value = "2"
        tp.focus()
        await pilot.press(":")                               # the command line, from the field
        await pilot.pause(0.1)
        assert isinstance(app.focused, CommandLine) and tp.value == "2"
        await pilot.press(*"help", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help by command")
        await pilot.press("escape")
        await pilot.pause(0.1)
        pp = setup.query_one("#f-pp", Input)
        pp.focus()
        await pilot.press("shift+tab")                       # shift+tab leaves it too
        await pilot.pause(0.1)
        assert app.focused is not None and app.focused is not pp
        pp.focus()
        await pilot.press("escape")                          # escape leaves the field
        await pilot.pause(0.1)
        assert app.focused is None
        setup.query_one("#f-dp", Input).focus()
        await pilot.press("q")                               # quits from a field, typed nowhere
        await wait_for(pilot, lambda: not app.is_running, timeout=20, what="q to quit")


async def test_r_toggles_run_and_pause():
    from partui.app.main import PartuiApp
    app = PartuiApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await launched(app, pilot, "plan single")
        await pilot.press("escape", "r")                     # run: open-ended, until r again
        await wait_for(pilot, lambda: len(app.world.history) >= 2, what="two steps of a run")
        assert app.busy
        await pilot.press("r")                               # pause
        await idle(app, pilot, "the pause")
        done = len(app.world.history)
        await pilot.pause(0.5)
        assert len(app.world.history) == done and not app.busy
        await command(app, pilot, "run 2")                   # a counted run ends by itself
        await idle(app, pilot, "run 2")
        assert len(app.world.history) == done + 2
        await pilot.press("escape", "r")                     # after a finished batch: runs again
        await wait_for(pilot, lambda: len(app.world.history) > done + 2, what="r after a batch")
        await pilot.press("r")
        await idle(app, pilot, "the second pause")
        await pilot.press("ctrl+c")
