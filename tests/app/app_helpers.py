"""Pilot helpers the app tests share: bounded waits and typing a command as a user would."""
import time


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
