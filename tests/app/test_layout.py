"""Every screen at 80x24: no label a user reads is clipped (a label is found whole on the screen,
not cut at a column edge or run into its neighbour)."""
import os
import re

import pytest

from app_helpers import command, engine_ready, idle, not_whole, screen_text, trace_one_step, wait_for

pytestmark = pytest.mark.timeout(300)
FOOTER_RUN = ("step", "run/pause", "trace", "command", "help", "quit", "palette")
SETUP = ("dp", "tp", "pp", "cp", "ep", "zero", "microbatches", "experts", "launch", "mesh", "command",
         "help", "quit", "palette", "1 rank", "schedule", "cp mode", "model", "tiny", "1f1b", "ring")
TABS = ("Params", "Grads", "Optim", "Shards", "Trace")
HEADERS = {"1": ("name", "global", "local", "piece", "norm"),
           "2": ("name", "piece", "norm", "absmax"),
           "3": ("name", "piece", "step", "m norm", "v norm"),
           "5": ("window", "compute", "comm", "ovl", "exposed", "idle", "ovl%", "bubble%")}


def clipped(app, labels) -> list[str]:
    return not_whole(app, labels, edge=r"\w%/")


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


async def test_eight_ranks_a_link_and_a_trace_at_80x24_clip_nothing():
    """Issue 28: with a link set, a trace recording and 8 ranks of a pipeline, every field of the
    status line, the mesh preview (its last columns a scroll away, and said so), and every column
    of the Trace tab, the pipeline's bubble table included, are on the screen whole."""
    from partui.app.main import PartuiApp
    from partui.app.screens.mesh import MeshScreen
    from partui.app.screens.run import RunScreen
    from textual.widgets import Input
    app = PartuiApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await engine_ready(app, pilot)
        form = app.setup_screen
        for name, value in (("dp", "2"), ("tp", "2"), ("pp", "2"), ("microbatches", "2")):
            form.query_one(f"#f-{name}", Input).value = value
        await pilot.pause(0.2)
        await pilot.press("ctrl+g")                          # the mesh preview of the 8 ranks
        await wait_for(pilot, lambda: isinstance(app.screen, MeshScreen) and app.screen.rows,
                       what="the mesh preview")
        await pilot.pause(0.3)
        hint = "wider than the screen: ← → scroll the table (to total MiB)"
        assert clipped(app, ("rank", "coords", "dp group", hint)) == [], screen_text(app)
        for _ in range(4):
            await pilot.press("right")
        await pilot.pause(0.3)
        assert clipped(app, ("grads MiB", "optimizer MiB", "total MiB")) == [], screen_text(app)
        await pilot.press("escape")
        await command(app, pilot, "plan 1f1b dp=2 tp=2 pp=2 microbatches=2")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")
        await idle(app, pilot)
        await command(app, pilot, "link alpha_us=20,gbps=5")
        await wait_for(pilot, lambda: app.world.link, what="the link")
        await idle(app, pilot, "the link")
        panel = await trace_one_step(app, pilot)            # t off saves it, draws the report
        os.remove(app.world.trace_path)
        # one set of figures: each rank's card (its last step, the traced one) and the Trace tab's
        # row for that step agree, both to one decimal
        for rank, row in enumerate(panel.report_rows("step")):
            card = str(app.screen.query_one(f"#card-{rank}").render())
            shown = dict(zip(("comp", "comm", "ovl", "exp"), map(float, re.findall(
                r"comp ([\d.]+) comm ([\d.]+) ms\novl ([\d.]+) \S+ exp ([\d.]+)", card)[0])))
            traced = dict(zip(("comp", "comm", "ovl", "exp"), map(float, row[3:7])))
            assert shown == pytest.approx(traced, abs=0.11), (rank, card, row)
        await pilot.press("t")                              # recording again: ● rec
        await idle(app, pilot, "trace start")
        status = ("● rec", "showing rank 0", "1 step", "loss", "link alpha_us=20,gbps=5", "8 ranks",
                  "dp 2 × tp 2 × pp 2")
        for key, title in zip("12345", TABS):
            await pilot.press(key)
            await pilot.pause(0.3)
            labels = status + TABS + FOOTER_RUN + HEADERS.get(key, ())
            assert clipped(app, labels) == [], f"tab {title}:\n{screen_text(app)}"
        pipe = app.screen.query_one("#report-pipe")
        app.screen.query_one("#trace-panel").scroll_to_widget(pipe, animate=False, top=True)
        await pilot.pause(0.3)
        assert clipped(app, ("pipe%", "sim%", "ideal%", "formula%")) == [], screen_text(app)
        await pilot.press("ctrl+c")
