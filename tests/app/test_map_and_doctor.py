"""The app's `map DIR` (issue 34: the reshard map `partui plan --resume` prints, onto the planned world)
and `doctor` (issue 37: the flight recorder's verdict and each rank's last ops), each in a scrolling
dialog; a bad folder is an error notification and the world keeps running."""
import pytest

from app_helpers import command, idle, launched, notifications, steps_then_save, wait_for
from partui.app.screens.dialogs import TextDialog
from partui.app.widgets.command_line import EXAMPLES, CommandError, parse

pytestmark = pytest.mark.timeout(240)


def test_map_and_doctor_grammar():
    assert parse("map ckpt").args == {"path": "ckpt"} and parse("doctor").verb == "doctor"
    with pytest.raises(CommandError, match="needs one folder"):
        parse("map")
    assert {"map ckpt", "doctor"} <= set(EXAMPLES)


def dialog_text(app) -> str:
    return str(app.screen.query_one("#text-body").render())


async def test_map_shows_saved_ranks_feeding_the_planned_world_and_doctor_the_last_ops(tmp_path):
    from partui.app.main import PartuiApp
    app = PartuiApp()
    async with app.run_test(size=(120, 40)) as pilot:
        await launched(app, pilot, "plan zero2 dp=2")
        seen = notifications(app)
        await steps_then_save(app, pilot, seen, 1, tmp_path)
        await command(app, pilot, f"map {tmp_path}")
        await wait_for(pilot, lambda: isinstance(app.screen, TextDialog), what="the map", timeout=120)
        text = dialog_text(app)
        assert "reshard: saved under" in text and "bytes each new rank reads" in text
        assert " 0 ->   1 " in text or " 1 ->   0 " in text      # ZeRO-2's shards cross ranks
        the_map = app.screen
        await pilot.press("escape")   # the map's dialog closes before doctor's opens: wait for its own
        await wait_for(pilot, lambda: app.screen is not the_map, what="the map closed")
        await command(app, pilot, "doctor")
        await wait_for(pilot, lambda: isinstance(app.screen, TextDialog) and app.screen is not the_map,
                       what="the verdict", timeout=60)
        text = dialog_text(app)
        assert "each rank's last 6 ops" in text and "rank 0 (step" in text and "rank 1 (step" in text
        assert "all_reduce" in text or "reduce_scatter" in text
        await pilot.press("escape")
        await command(app, pilot, f"map {tmp_path / 'nope'}")
        await wait_for(pilot, lambda: any(s == "error" for _, s in seen), what="the refusal")
        await pilot.press("escape", "q")


def test_a_field_whose_default_is_none_takes_none_back_in_the_command_line():
    """`--capacity-factor 0`'s fix says 'no --capacity-factor'; in the app that is `capacity_factor=None`
    (or off): typed, it parses to no limit, where it was refused as not a number."""
    assert parse("plan gshard capacity_factor=None").args["fields"] == {"capacity_factor": None}
    assert parse("plan gshard capacity_factor=off").args["fields"] == {"capacity_factor": None}
    with pytest.raises(CommandError, match="not a whole number"):
        parse("plan gshard dp=None")          # dp's default is a number: None is no value of it
