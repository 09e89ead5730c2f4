"""Every screen at 80x24: no label a user reads is clipped (a label is found whole on the screen,
not cut at a column edge or run into its neighbour)."""
import os
import re

import pytest

from app_helpers import command, engine_ready, idle, trace_one_step, wait_for

pytestmark = pytest.mark.timeout(300)
FOOTER_RUN = ("step", "run/pause", "trace", "command", "help", "quit", "palette")
SETUP = ("dp", "tp", "pp", "cp", "ep", "zero", "microbatches", "experts", "launch", "mesh", "command",
         "help", "quit", "palette", "1 rank")
TABS = ("Params", "Grads", "Optim", "Shards", "Trace")
HEADERS = {"1": ("name", "global", "local", "piece", "norm"),
           "2": ("name", "piece", "norm", "absmax"),
           "3": ("name", "piece", "step", "m norm", "v norm"),
           "5": ("window", "compute", "comm", "ovl", "exposed", "idle", "ovl%", "bubble%")}


def screen_text(app) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def clipped(app, labels) -> list[str]:
    text = screen_text(app)
    return [lb for lb in labels if not re.search(rf"(?<![\w%/]){re.escape(lb)}(?![\w%/])", text)]


async def test_screens_at_80x24_clip_no_label():
    from partui.app.main import PartuiApp
    from partui.app.screens.run import RunScreen
    from partui.app.widgets.inspector import Inspector
    app = PartuiApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await engine_ready(app, pilot)
        await pilot.pause(0.3)
        assert clipped(app, SETUP) == [], screen_text(app)
        await command(app, pilot, "plan zero2 dp=2")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")
        await idle(app, pilot)
        await pilot.press("escape", "s")
        await pilot.pause(0.05)
        await idle(app, pilot, "a step")
        await wait_for(pilot, lambda: len(app.inspect_ms) == 1, what="the inspector refresh")
        await command(app, pilot, "show rank 0 grad lm_head")   # a grad rank 0 holds
        await pilot.pause(0.3)
        absmax = [r[3] for r in app.screen.query_one(Inspector).rows("grad") if r[3] != "—"]
        assert absmax and clipped(app, absmax[:1]) == [], screen_text(app)   # e.g. 5.823e-05 whole
        await command(app, pilot, "show rank 0 params")           # no filter
        await trace_one_step(app, pilot)                    # t off saves it, draws the report
        os.remove(app.world.trace_path)
        for key, title in zip("12345", TABS):
            await pilot.press(key)
            await pilot.pause(0.3)
            labels = TABS + FOOTER_RUN + ("2 ranks",) + HEADERS.get(key, ())
            assert clipped(app, labels) == [], f"tab {title}:\n{screen_text(app)}"
        await pilot.press("ctrl+c")


async def test_pipeline_trace_report_at_120x40_clips_no_header():
    """A pipeline's report has the two theory columns too; with the rank cards shown at 120."""
    from partui.app.main import PartuiApp
    from partui.app.screens.run import RunScreen
    app = PartuiApp()
    async with app.run_test(size=(120, 40)) as pilot:
        await engine_ready(app, pilot)
        await command(app, pilot, "plan 1f1b")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")
        await idle(app, pilot)
        await trace_one_step(app, pilot)                    # t off saves it, draws the report
        os.remove(app.world.trace_path)
        await pilot.pause(0.3)
        labels = HEADERS["5"] + ("pipe%", "sim%", "formula%", "rank 0", "rank 1") + FOOTER_RUN
        assert clipped(app, labels) == [], screen_text(app)
        await pilot.press("ctrl+c")
