"""Pilot helpers the app tests share: bounded waits and typing a command as a user would."""
import re
import time

from partui.app.screens.run import RunScreen


async def wait_for(pilot, cond, timeout=90.0, what="condition"):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await pilot.pause(0.05)


async def engine_ready(app, pilot):
    await wait_for(pilot, lambda: app.engine_ready, what="the engine to load")
    await pilot.pause(0.1)


async def command(app, pilot, text):
    """Type a command into the screen's command line and press enter, as a user would."""
    app.screen.query_one("#command").focus()
    await pilot.pause()
    await pilot.press(*text)
    await pilot.press("enter")
    await pilot.pause()


async def idle(app, pilot, what="the world to be idle"):
    await wait_for(pilot, lambda: not app.busy, what=what)
    await pilot.pause(0.1)


async def launched(app, pilot, plan_command: str):
    """Wait for the engine, type `plan_command` (e.g. "plan dp dp=2"), wait for the run screen and an
    idle world; the world's pids."""
    await engine_ready(app, pilot)
    await command(app, pilot, plan_command)
    await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")
    await idle(app, pilot)
    return app.world.pids()


def notifications(app) -> list:
    """(message, severity) of every notification the app posts from now on (app.notify replaced)."""
    seen = []
    app.notify = lambda msg, **kw: seen.append((msg, kw.get("severity")))
    return seen


async def steps_then_save(app, pilot, seen, steps: int, folder) -> None:
    """`step N`, then `save FOLDER`, each waited for, until a notification in `seen` says saved."""
    await command(app, pilot, f"step {steps}")
    await idle(app, pilot, f"step {steps}")
    await command(app, pilot, f"save {folder}")
    await idle(app, pilot, "save")
    await wait_for(pilot, lambda: any("saved" in m for m, _ in seen), what="the save")


async def trace_one_step(app, pilot):
    """`t` on, `s`, `t` off (which saves the trace and draws its report), as a user would; returns
    the trace panel once its per-rank report is drawn."""
    await pilot.press("escape", "t")
    await idle(app, pilot, "trace start")
    assert app.world.recording
    await pilot.press("s")
    await pilot.pause(0.05)
    await idle(app, pilot, "a traced step")
    await pilot.press("t")
    panel = app.screen.query_one("#trace-panel")
    await wait_for(pilot, lambda: panel.report_rows("rank"), what="the trace report")
    return panel


def screen_text(app) -> str:
    """What the screen shows now, a line per row."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def not_whole(app, labels, edge: str = r"\w%/-") -> list[str]:
    """The labels not found whole on the screen: cut at an edge, or run into a neighbour (a
    character of `edge` beside it)."""
    text = screen_text(app)
    return [lb for lb in labels if not re.search(rf"(?<![{edge}]){re.escape(lb)}(?![{edge}])", text)]

