"""The app's `save DIR` / `load DIR` (issue 34): the grammar, and typed between steps they checkpoint
the world and resume it (numbered on from the checkpoint's step); a bad folder is an error
notification naming the fix, and the world keeps running."""
import pytest

from app_helpers import command, idle, launched, notifications, steps_then_save, wait_for
from partui.app.widgets.command_line import EXAMPLES, CommandError, parse

pytestmark = pytest.mark.timeout(200)


def test_checkpoint_grammar():
    assert parse("save ckpt").args == {"path": "ckpt"}
    assert parse(":load ckpt/step-00000002").args == {"path": "ckpt/step-00000002"}
    for bad in ("save", "load a b"):
        with pytest.raises(CommandError, match="needs one folder"):
            parse(bad)
    assert {"save ckpt", "load ckpt"} <= set(EXAMPLES)


async def test_save_and_load_between_steps(tmp_path):
    from partui.app.main import PartuiApp
    app = PartuiApp()
    async with app.run_test(size=(120, 40)) as pilot:
        await launched(app, pilot, "plan zero2 dp=2")
        seen = notifications(app)
        await steps_then_save(app, pilot, seen, 2, tmp_path)
        assert (tmp_path / "step-00000002" / "partui.json").exists()
        await command(app, pilot, "step 1")
        await idle(app, pilot, "step 1")
        await command(app, pilot, f"load {tmp_path}")
        await idle(app, pilot, "load")
        await wait_for(pilot, lambda: any("resumed at step 2" in m for m, _ in seen), what="load")
        await command(app, pilot, f"load {tmp_path / 'nope'}")
        await idle(app, pilot, "load nope")
        await wait_for(pilot, lambda: any(s == "error" for _, s in seen), what="the refusal")
        assert any("no such folder" in m and s == "error" for m, s in seen)
        await pilot.press("escape", "q")
