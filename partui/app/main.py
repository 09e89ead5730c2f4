"""`partui`: the terminal app. A client of partui.world.world.World; launches, steps, snapshots and
trace analysis run in thread workers, so keys are handled while the ranks work."""
from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
from functools import partial

from textual import on, work
from textual.app import App
from textual.binding import Binding
from textual.widgets import Input

from partui.app.screens.commands import CommandsMixin, CommandsProvider
from partui.app.screens.dialogs import ErrorDialog, HelpScreen
from partui.app.screens.run import RunScreen
from partui.app.screens.setup import SetupScreen, cores_warning
from partui.app.screens.style import CSS
from partui.app.screens.trace_actions import TraceMixin
from partui.app.widgets.command_line import CommandLine
from partui.world.launch import RankError, WorldTimeout, warm_up
from partui.world.plans import PRESETS, build_plan
from partui.world.world import World


@contextlib.contextmanager
def real_stderr():
    """multiprocessing's resource tracker passes sys.stderr.fileno() to its child; under Textual
    stderr is a capture object whose fileno is -1, so hand it the process's real stderr."""
    saved = sys.stderr
    sys.stderr = sys.__stderr__
    try:
        yield
    finally:
        sys.stderr = saved


class PartuiApp(TraceMixin, CommandsMixin, App):
    TITLE = "partui"
    NOTIFICATION_TIMEOUT = 4   # a toast leaves the tables soon; dialogs and tab keys clear them
    SUB_TITLE = "distributed training, rank by rank"
    CSS = CSS
    COMMANDS = App.COMMANDS | {CommandsProvider}
    BINDINGS = [Binding("q", "quit", "quit"), Binding("ctrl+c", "quit", "quit", show=False,
                                                      priority=True),
                Binding("question_mark", "help", "help", show=False)]

    def __init__(self, world: World | None = None, **kw):
        super().__init__(**kw)
        self.world = world or World()
        self.engine_ready = False
        self.busy = False                 # one launch / step / trace action at a time
        self.pause_requested = False
        self.refresh_ms: list[float] = []  # step end -> cards and loss redrawn, one per step
        self.inspect_ms: list[float] = []  # step end -> snapshot taken and tabs redrawn
        self.first_frame_s: float | None = None
        self.pids_seen: set[int] = set()
        self.quitting = False             # q pressed: a worker's late failure shows nothing

    # ---------------------------------------------------------------- start-up
    def on_mount(self) -> None:
        self.setup_screen = SetupScreen({k: v for k, v in PRESETS.items()})
        self.push_screen(self.setup_screen)
        # torch loads after the first frame, in a daemon thread so a quick quit need not wait
        self.call_after_refresh(lambda: threading.Thread(target=self.load_engine, daemon=True,
                                                         name="partui-load-engine").start())

    def load_engine(self) -> None:
        try:
            with real_stderr():
                warm_up()                    # the fork server imports torch for the ranks
            build_plan("single")             # and this process (the engine, torch), for plans
        except Exception as e:  # noqa: BLE001 - say why nothing can launch
            if self.is_running:
                self.ui(self.fail, "the engine failed to load", e)
            return
        if self.is_running:
            self.ui(self._engine_loaded)

    def _engine_loaded(self) -> None:
        self.engine_ready = True
        self.setup_screen.revalidate()

    # ---------------------------------------------------------------- helpers
    def run_screen(self):
        """The Run screen when it is in the stack (perhaps under a dialog), else None."""
        return next((s for s in reversed(self.screen_stack) if isinstance(s, RunScreen)), None)

    def fail(self, title: str, exc: BaseException) -> None:
        """A dialog naming what happened (no toast over it); the app stays usable."""
        if self.quitting:                 # the ranks were stopped on purpose
            return
        detail = getattr(exc, "traceback", "") or ""
        rs = self.run_screen()
        if rs is not None:
            rs.set_busy(False)
            rs.update_status()
        self.push_screen(ErrorDialog(title, str(exc), detail[-3000:]))

    def ui(self, fn, *args):
        """call_from_thread for workers, quiet once the app has gone (a worker outliving q)."""
        if not self.is_running:
            return None
        try:
            return self.call_from_thread(fn, *args)
        except RuntimeError:   # the app stopped between the check and the call
            return None

    def _begin(self) -> bool:
        if self.busy:
            self.notify("the world is busy (a launch or step is in flight): wait or pause (r)")
            return False
        self.busy = True
        return True

    def _end(self) -> None:
        self.busy = False

    # ---------------------------------------------------------------- launch
    def launch_world(self, preset: str, model: str, fields: dict) -> None:
        if not self._begin():
            return
        shown = self.shown_plan()
        try:
            plan = self.world.plan(preset, model, **fields)
        except ValueError as e:
            self._end()
            self.notify(str(e), title="invalid plan", severity="error", timeout=8)
            return
        crowded = cores_warning(plan.world)
        if crowded:
            self.notify(crowded, title="slow steps ahead", severity="warning", timeout=8)
        self._launch_worker(shown)

    def shown_plan(self) -> tuple | None:
        """What the run screen shows (preset, plan, cfg, model): the world a failed launch leaves
        on screen, so the status line goes back to it (World.plan has closed it: x relaunches)."""
        if self.run_screen() is None or self.world.current_plan is None:
            return None
        w = self.world
        return w.preset, w.current_plan, w.cfg, w.model

    @work(thread=True, group="world")
    def _launch_worker(self, shown: tuple | None = None) -> None:
        say = partial(self.ui, self._progress)
        try:
            infos = self.world.launch(on_progress=say)
            self.pids_seen.update(self.world.pids())
            snaps = self.world.snapshot()    # step 0's state, so the tabs are never empty
            self.ui(self._show_run, infos, snaps)
        except Exception as e:  # noqa: BLE001 - any failure is shown; the app stays usable
            if shown is not None:   # the cards and tabs still show that world: so does the status
                w = self.world
                w.preset, w.current_plan, w.cfg, w.model = shown
            self.ui(self.fail, "launch failed", e)
        finally:
            self.ui(self._end)

    def _progress(self, msg: str) -> None:
        if self.run_screen() is None:
            self.setup_screen.progress(msg)
        else:
            self.run_screen().update_status(msg)

    def _show_run(self, infos: list[dict], snaps: list[dict]) -> None:
        screen = RunScreen(self.world, infos, list(PRESETS), snaps)
        if isinstance(self.screen, RunScreen):
            self.switch_screen(screen)      # reset or a new plan: a fresh screen for the new world
        else:
            self.push_screen(screen)
        self.setup_screen.progress("")

    # ---------------------------------------------------------------- stepping
    def action_step(self, n: int = 1) -> None:
        if self.run_screen() is None:
            self.notify("launch a world first (Enter on a preset)")
            return
        if self._begin():
            self.pause_requested = False
            self.run_screen().set_busy(True)
            self._step_worker(n, single=True)

    def action_run_or_pause(self, n: int = 0) -> None:
        """`r`: a toggle. Running (or stepping): pause after this step; idle: run until `r` again
        (n = 0), or n steps (`run N`), pausable."""
        if self.busy:
            self.pause_requested = True
            self.notify("pausing after this step")
            return
        if self.run_screen() is not None and self._begin():
            self.pause_requested = False
            self.run_screen().set_busy(True)
            self._step_worker(n, single=False)

    @work(thread=True, group="world")
    def _step_worker(self, n: int, single: bool) -> None:
        """`single`: one call of n steps; else n calls of one step each (n = 0: until paused),
        pausable between."""
        try:
            todo = [n] if single else itertools.repeat(1, n) if n else itertools.repeat(1)
            for k in todo:
                if self.pause_requested:
                    break
                line = self.world.step(k)[-1]
                t_end = time.perf_counter()
                self.ui(self._show_step, line, None, t_end, self.refresh_ms)
                snaps = self.world.snapshot()  # the inspector follows the cards
                self.ui(self._show_step, None, snaps, t_end, self.inspect_ms)
        except (RankError, WorldTimeout) as e:
            self.ui(self.fail, f"rank failure at step {self.world.steps_done}", e)
        except Exception as e:  # noqa: BLE001 - any failure is shown; the app stays usable
            self.ui(self.fail, "step failed", e)
        finally:
            self.ui(self._step_done)

    def _show_step(self, line, snaps, t_end: float, delays: list) -> None:
        rs = self.run_screen()
        if rs is None:
            return
        rs.show_step(line, snaps)
        self.call_after_refresh(lambda: delays.append(1e3 * (time.perf_counter() - t_end)))

    def _step_done(self) -> None:
        self._end()
        if self.run_screen() is not None:
            self.run_screen().set_busy(False)
            self.run_screen().update_status()

    def action_reset(self) -> None:
        if self.world.current_plan is not None and self._begin():
            self._launch_worker()

    def action_setup(self) -> None:
        if isinstance(self.screen, RunScreen):
            self.pop_screen()
            if self.world.current_plan is not None:   # the form shows the plan that is running
                self.setup_screen.show_plan(self.world.current_plan, self.world.model)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    # ---------------------------------------------------------------- the command line
    @on(Input.Submitted, "#command")
    def command_submitted(self, event: Input.Submitted) -> None:
        cl = event.input
        if isinstance(cl, CommandLine):
            cl.remember(event.value)
        cl.value = ""
        cl.screen.set_focus(None)    # the keys go back to the screen: the next `s` steps
        self.execute(event.value)

    # ---------------------------------------------------------------- quitting
    async def action_quit(self) -> None:
        """The ranks go before the app does (no process is left), without waiting for a step in
        flight: the screen says so and stays live while they stop."""
        if self.quitting:
            return
        self.quitting = self.pause_requested = True
        if not self.world.launched:
            self.exit()
            return
        rs = self.run_screen()
        if rs is not None:
            rs.update_status("quitting: stopping the ranks ...")
        self._quit_worker()

    @work(thread=True, group="quit")
    def _quit_worker(self) -> None:
        # a step in flight is cut short: its ranks, busy in it, would not answer a shutdown
        self.world.close(wait_s=0.0, grace_s=0.5 if self.busy else 3.0)
        self.ui(self.exit)


def main() -> int:
    app = PartuiApp()
    try:
        app.run()
    finally:
        app.world.close()
    return app.return_code or 0
