"""The terminal app driven by Textual's Pilot: launch, step, inspect, trace, bad input, failure,
quit. Multi-process tests: every wait is bounded."""
import os
import subprocess
import sys
import time

import pytest

from app_helpers import command, engine_ready, idle, launched, wait_for
from partui.app.widgets.command_line import CommandError, CommandSuggester, parse
from partui.app.widgets.shard_map import holds, piece_label

pytestmark = pytest.mark.timeout(300)
SIZE = (100, 30)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" in f.read()
    except FileNotFoundError:
        return True


def assert_no_process(pids, timeout=10.0):
    t0 = time.monotonic()
    while not all(gone(p) for p in pids):
        assert time.monotonic() - t0 < timeout, f"rank processes left: {[p for p in pids if not gone(p)]}"
        time.sleep(0.1)


def notes(app) -> str:
    return " | ".join(str(n.message) for n in app._notifications)


# ---------------------------------------------------------------- pure parts

def test_first_frame_imports_neither_torch_nor_pandas():
    """torch loads in a thread after the first frame and pandas on the first trace report: an
    import moved to a module's top that drags either in slows the first frame by seconds."""
    heavy = ("torch", "pandas", "markdown_it")
    code = ("import sys, partui.app.main; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", f"importing partui.app.main loads {proc.stdout.strip()}"


def test_parse_commands():
    c = parse("plan zero3 dp=4 microbatches=2 schedule=gpipe")
    assert c.verb == "plan" and c.args["preset"] == "zero3"
    assert c.args["fields"] == {"dp": 4, "microbatches": 2, "schedule": "gpipe"}
    assert parse("step 3").args == {"n": 3}
    assert parse("run").args == {"n": 20}
    assert parse("show rank 2 grad layers.1.wq").args == {"rank": 2, "what": "grad",
                                                          "name": "layers.1.wq"}
    assert parse("trace save demo").args == {"action": "save", "name": "demo"}
    for bad, msg in (("stpe 3", "unknown command"), ("step x", "not a whole number"),
                     ("plan zero3 dp", "key=value"), ("show 2", "show needs a rank"),
                     ("plan zero3 foo=1", "unknown plan field"), ("step 0", ">= 1")):
        with pytest.raises(CommandError, match=msg):
            parse(bad)


async def test_suggester_completes_words():
    s = CommandSuggester(["zero2", "zero3", "dp"], lambda: ["layers.1.attn.wq.weight"])
    assert await s.get_suggestion("pl") == "plan"
    assert await s.get_suggestion("plan ze") == "plan zero"     # zero2 / zero3 part here
    assert await s.get_suggestion("show rank 1 op") == "show rank 1 optim"
    assert await s.get_suggestion("show rank 1 layers.1.a") == "show rank 1 layers.1.attn.wq.weight"
    d = CommandSuggester(["dualpipe", "dualpipev", "dp"], lambda: [])
    assert await d.get_suggestion("plan dual") == "plan dualpipe"   # stops where the two part
    assert await d.get_suggestion("plan dualpipe") is None
    assert d.matches("plan dualpipe") == ["dualpipe", "dualpipev"]   # tab then offers both
    assert await d.get_suggestion("plan dualpipev") is None


def test_shard_map_geometry():
    shape = [4, 6]
    assert holds("slice", [[0, 2], [0, 6]], shape, 11) and not holds("slice", [[0, 2], [0, 6]], shape, 12)
    assert holds("slice", [[0, 4], [3, 6]], shape, 3) and not holds("slice", [[0, 4], [3, 6]], shape, 2)
    assert holds("flat", [12, 24], shape, 12) and not holds("flat", [12, 24], shape, 11)
    assert piece_label("slice", [[0, 4], [3, 6]], shape) == "[:, 3:6]"
    assert piece_label("flat", [0, 12], shape) == "flat [0:12]"


# ---------------------------------------------------------------- the app, end to end

async def test_zero2_step_inspect_trace_quit(tmp_path):
    from partui.app.main import PartuiApp
    from partui.app.screens.run import RunScreen
    from partui.app.widgets.inspector import TABS, Inspector, optim_rows
    app = PartuiApp()
    async with app.run_test(size=SIZE) as pilot:
        await engine_ready(app, pilot)
        assert "✓ valid" in str(app.setup_screen.query_one("#status").render())
        await command(app, pilot, "plan zero2 dp=2")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")
        pids = app.world.pids()
        assert len(pids) == 2 and app.world.current_plan.zero == 2
        await idle(app, pilot)
        await pilot.press("escape")                          # leave the command line: keys are bindings
        for _ in range(2):
            await pilot.press("s")
            await pilot.pause(0.05)
            await idle(app, pilot, "a step")
        await wait_for(pilot, lambda: len(app.inspect_ms) == 2, what="the inspector refresh")
        assert len(app.world.history) == 2
        cards = app.screen.cards()                         # each card shows its rank's ledger of the last step
        assert [c.last["ledger"] for c in cards] == app.world.history[-1]["ledgers"]
        await command(app, pilot, "show rank 1 optim")
        await pilot.pause(0.2)
        insp = app.screen.query_one(Inspector)
        assert app.screen.selected == 1 and insp.active == TABS["optim"]
        shown = insp.rows("optim")
        snap = app.world.snapshot()[1]           # the rank's own snapshot, no step in between
        assert snap["rank"] == 1 and snap["optimizer"], "rank 1 holds AdamW state"
        expect = [list(r) for r in optim_rows(snap)]
        assert shown == expect and len(shown) == len(snap["optimizer"])
        assert all(o["step"] == 2 for o in snap["optimizer"])
        assert all(row[2] == "2" for row in shown)           # step column
        m0 = snap["optimizer"][0]["state"]["m"]["norm"]
        assert shown[0][3] == f"{m0:.4g}" and m0 > 0          # m norm, non-zero after 2 steps
        # record a trace, step, save, read the report
        await pilot.press("escape", "t")                     # leave the command line, trace on
        await idle(app, pilot, "trace start")
        assert app.world.recording
        await pilot.press("s")
        await pilot.pause(0.05)
        await idle(app, pilot, "a traced step")
        path = str(tmp_path / "app_trace.json")
        await command(app, pilot, f"trace save {path}")
        panel = app.screen.query_one("#trace-panel")
        await wait_for(pilot, lambda: panel.report_rows("rank"), what="the trace report")
        assert os.path.isfile(path) and app.world.trace_path == path
        by_rank = panel.report_rows("rank")
        assert [r[0] for r in by_rank] == ["0", "1"]
        assert [r[:2] for r in panel.report_rows("step")] == [["0", "2"], ["1", "2"]]
        assert "r0" in str(panel.query_one("#timeline").render())
        assert insp.active == TABS["trace"]
        await pilot.press("escape", "q")                     # q in the command line is a letter
    assert_no_process(pids)


async def test_invalid_mesh_shows_plan_message():
    from partui.app.main import PartuiApp
    from textual.widgets import Input
    app = PartuiApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await engine_ready(app, pilot)
        app.setup_screen.query_one("#f-tp", Input).value = "3"
        await pilot.pause(0.2)
        status = str(app.setup_screen.query_one("#status").render())
        assert "tp 3 does not divide 4 heads: pick tp in 1, 2, 4" in status
        assert app.setup_screen.query_one("#status").has_class("-invalid")
        await pilot.press("ctrl+l")                          # launch refuses, names the problem
        await pilot.pause(0.2)
        assert "tp 3 does not divide 4 heads" in notes(app)
        await command(app, pilot, "plan dp dp=3")            # batch 8 is not divisible by 3
        await pilot.pause(0.2)
        assert "global batch 8 is not divisible by dp 3" in notes(app)
        assert app.world.controller is None and not app.busy
        app.setup_screen.query_one("#f-tp", Input).value = "2"
        await pilot.pause(0.2)
        assert "✓ valid" in str(app.setup_screen.query_one("#status").render())


async def test_rank_failure_shows_and_app_recovers():
    from partui.app.main import PartuiApp
    from partui.app.screens.dialogs import ErrorDialog
    from partui.app.screens.run import RunScreen
    app = PartuiApp()
    async with app.run_test(size=SIZE) as pilot:
        old = await launched(app, pilot, "plan dp dp=2")
        app.world.controller.inject_fault(1, step=1)
        await command(app, pilot, "step 2")                  # step 0 runs, rank 1 raises at step 1
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorDialog), what="the error dialog")
        dialog = app.screen
        assert "rank 1" in dialog.message and "injected fault at step 1" in dialog.message
        assert "InjectedFault" in dialog.detail
        assert_no_process(old)                               # the failed world was torn down
        await pilot.press("escape")                          # dismiss the dialog
        await pilot.pause(0.1)
        await pilot.press("escape")                          # and leave the command line
        assert isinstance(app.screen, RunScreen)
        assert "world closed" in str(app.screen.query_one("#run-status").render())
        await pilot.press("x")                               # reset: the same plan, fresh world
        await wait_for(pilot, lambda: app.world.launched and not app.busy, what="the reset")
        await pilot.pause(0.2)
        new = app.world.pids()
        assert set(new).isdisjoint(old)
        await pilot.press("s")
        await pilot.pause(0.05)
        await idle(app, pilot, "a step after reset")
        assert [ln["step"] for ln in app.world.history] == [0], (notes(app), app.focused, app.screen_stack)
        await pilot.press("ctrl+c")
    assert_no_process(new)


async def test_command_palette_runs_app_commands():
    from partui.app.main import PartuiApp
    from partui.app.screens.dialogs import HelpScreen
    app = PartuiApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        await pilot.press(*"help")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), 10, "the help screen")
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, HelpScreen)
