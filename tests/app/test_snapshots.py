"""The app's screens at 80x24 pinned as SVG snapshots (pytest-textual-snapshot, as Textual's own
apps are tested): setup with two presets, the help, the Mesh dialog and the run screen at step 0
with its rank cards. Each is taken once the screen holds only what a user would read: the engine
loaded, no toast, no time, no timing (step 0: nothing has run), and the cores warning pinned off
(this machine's core count is not the snapshot's). `pytest --snapshot-update` redraws them after a
change meant to show; tests/app/__snapshots__ holds them."""
import pytest

from app_helpers import engine_ready, idle, wait_for
from partui.app.screens import setup
from partui.world.plans import PRESETS

pytest.importorskip("pytest_textual_snapshot")   # the test extra installs it (pyproject.toml)
pytestmark = pytest.mark.timeout(200)


@pytest.fixture
def app(monkeypatch):
    from partui.app.main import PartuiApp
    monkeypatch.setattr(setup, "usable_cpus", lambda: 64)
    app = PartuiApp()
    yield app
    app.world.close()        # the screenshot ends the app, not its quit: no rank is left


async def settled(pilot):
    """No toast and nothing left to draw."""
    pilot.app.clear_notifications()
    await pilot.pause(0.3)


def test_setup_single(snap_compare, app):
    async def ready(pilot):
        await engine_ready(app, pilot)
        await settled(pilot)
    assert snap_compare(app, run_before=ready, terminal_size=(80, 24))


def test_setup_deepseek_preset(snap_compare, app):
    async def deepseek(pilot):
        await engine_ready(app, pilot)
        await pilot.press(*["down"] * (list(PRESETS).index("deepseek")))
        await wait_for(pilot, lambda: app.setup_screen.highlighted == "deepseek", what="deepseek")
        app.setup_screen.revalidate()
        await settled(pilot)
    assert snap_compare(app, run_before=deepseek, terminal_size=(80, 24))


def test_help(snap_compare, app):
    async def help_open(pilot):
        await engine_ready(app, pilot)
        await pilot.press("question_mark")
        await settled(pilot)
    assert snap_compare(app, run_before=help_open, terminal_size=(80, 24))


def test_mesh_dialog(snap_compare, app):
    async def mesh_open(pilot):
        await engine_ready(app, pilot)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: getattr(app.screen, "rows", None), what="the mesh table")
        await settled(pilot)
    assert snap_compare(app, run_before=mesh_open, terminal_size=(80, 24))


def test_run_screen_at_step_0_with_cards(snap_compare, app):
    from partui.app.screens.run import RunScreen

    async def launched(pilot):
        await engine_ready(app, pilot)
        await pilot.press("enter")                       # single, as highlighted
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), what="the run screen")
        await idle(app, pilot)
        await pilot.press("c")                           # the cards beside the tabs
        await settled(pilot)
    assert snap_compare(app, run_before=launched, terminal_size=(80, 24))
