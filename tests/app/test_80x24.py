"""Issue 35 item 7: the app at 80x24, through every preset, tab and dialog: nothing a user needs is
off the screen (every preset, the form's fields and buttons, the status line; the seven tab titles,
with the rank cards shown too; each dialog's Close / OK button), no toast over a dialog or a tab
just asked for, and the help's command list is read line by line, never a word a line."""
import re

import pytest

from app_helpers import command, engine_ready, launched, not_whole, screen_text, wait_for
from partui.world.plans import PRESETS

pytestmark = pytest.mark.timeout(300)
TAB_TITLES = ("Params", "Grads", "Optim", "Shards", "Trace", "Routing", "Memory")
FORM = ("dp", "tp", "pp", "cp", "ep", "zero", "microbatches", "experts", "top-k", "schedule",
        "cp mode", "sp", "fb overlap", "dtype", "model", "Launch ⏎", "Mesh ^g")


async def test_every_preset_on_screen_with_its_own_status():
    from partui.app.main import PartuiApp
    app = PartuiApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await engine_ready(app, pilot)
        form = app.setup_screen
        labels = [label for label, _ in PRESETS.values()]
        statuses = {}
        for i, name in enumerate(PRESETS):
            if i:
                await pilot.press("down")
            await wait_for(pilot, lambda: form.highlighted == name, what=f"preset {name}")
            form.revalidate()
            await pilot.pause(0.05)
            assert not_whole(app, labels + list(FORM)) == [], f"{name}:\n{screen_text(app)}"
            status = str(form.query_one("#status").render())
            assert status.startswith(f"✓ valid: {PRESETS[name][0]} · "), (name, status)
            statuses[name] = status.split("\n")[0]
            head = statuses[name][:60]                   # the status line's start is on screen
            assert head in screen_text(app).replace("\n", " ") or head[:40] in screen_text(app), \
                screen_text(app)
        # GShard, DeepSeek and custom (which keeps DeepSeek's mesh) read apart
        assert len({statuses[n] for n in ("gshard", "deepseek", "custom")}) == 3, statuses
        assert "4 experts gshard" in statuses["gshard"]
        assert "8 experts deepseek" in statuses["deepseek"]
        await pilot.press("ctrl+c")


async def test_every_tab_and_dialog_at_80x24():
    from partui.app.main import PartuiApp
    from partui.app.screens.dialogs import ErrorDialog, HelpScreen
    from partui.app.screens.mesh import MeshScreen
    from partui.app.screens.run import RunScreen
    from textual.widgets import Input
    app = PartuiApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await engine_ready(app, pilot)
        # the Mesh dialog of 8 ranks: Close on screen while it works and once its table is drawn
        form = app.setup_screen
        for name, value in (("dp", "2"), ("tp", "2"), ("pp", "2"), ("microbatches", "2")):
            form.query_one(f"#f-{name}", Input).value = value
        await pilot.pause(0.2)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.screen, MeshScreen), what="the mesh dialog")
        await pilot.pause(0.1)
        assert not_whole(app, ("Close (esc)",)) == [], screen_text(app)
        await wait_for(pilot, lambda: app.screen.rows, what="the mesh table")
        await pilot.pause(0.2)
        assert not_whole(app, ("Close (esc)", "rank", "coords")) == [], screen_text(app)
        await pilot.press("escape")

        pids = await launched(app, pilot, "plan zero2 dp=2")
        assert pids and isinstance(app.screen, RunScreen)
        # a toast (the link's) is cleared by the help and by a tab key: neither is covered
        await command(app, pilot, "link alpha_us=20,gbps=5")
        await wait_for(pilot, lambda: app.world.link and not app.busy, what="the link")
        await wait_for(pilot, lambda: app._notifications, what="the link's toast")
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        await pilot.pause(0.2)
        assert not app._notifications
        assert not_whole(app, ("Close (esc)",)) == [], screen_text(app)
        app.screen.query_one(".dialog-body").scroll_end(animate=False)   # the command list
        await pilot.pause(0.3)
        box = app.screen.query_one("#help-box").region
        inside = [ln[box.x + 1:box.right - 1].strip(" █▎▊▃▅")
                  for ln in screen_text(app).splitlines()[box.y + 1:box.bottom - 1]]
        bullets = [ln for ln in inside if ln.startswith("• ")]
        assert len(bullets) >= 6 and all(": " in ln for ln in bullets), "\n".join(inside)
        assert not [ln for ln in inside if re.fullmatch(r"[\w`-]+", ln)], "\n".join(inside)
        assert not_whole(app, ("Close (esc)",)) == [], screen_text(app)
        await pilot.press("escape")
        await command(app, pilot, "link off")
        await wait_for(pilot, lambda: not app.world.link and not app.busy, what="link off")
        for cards in (False, True):                   # c shows the cards beside the tabs
            if cards:
                await pilot.press("c")
            for key, title in zip("1234567", TAB_TITLES):
                await pilot.press(key)
                await pilot.pause(0.15)
                assert not app._notifications
                assert not_whole(app, TAB_TITLES) == [], f"cards {cards}, tab {title}:\n{screen_text(app)}"
                if cards:
                    assert not_whole(app, ("rank 0", "rank 1")) == [], screen_text(app)
        # an error dialog: its OK button on screen, no toast over it
        await command(app, pilot, "report")                  # no trace saved yet
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the error dialog")
        await pilot.pause(0.2)
        assert not app._notifications
        assert not_whole(app, ("OK (esc)", "report failed")) == [], screen_text(app)
        await pilot.press("escape")
        await pilot.press("ctrl+c")
