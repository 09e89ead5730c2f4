"""The command line's verbs, run by the app (`execute`) and offered in Textual's palette."""
from __future__ import annotations

from functools import partial

from textual import work
from textual.command import DiscoveryHit, Hit, Hits, Provider

from partui.app.screens.dialogs import TextDialog
from partui.app.widgets.command_line import EXAMPLES, CommandError, parse
from partui.checkpoints.checkpoint import check_resume
from partui.diagnosis.doctor import last_ops
from partui.world.launch import RankError, WorldTimeout
from partui.world.plans import PRESETS
from planning.mesh import Plan


class CommandsProvider(Provider):
    """The command line's verbs in Textual's palette (ctrl+p)."""

    def commands(self) -> dict[str, str]:
        """command -> what it does."""
        plans = {f"plan {p}": f"plan {label} and launch it" for p, (label, _) in PRESETS.items()
                 if p != "custom"}
        return dict(EXAMPLES, **plans)

    async def discover(self) -> Hits:
        for cmd, does in EXAMPLES.items():
            yield DiscoveryHit(cmd, partial(self.app.execute, cmd), help=does)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for cmd, does in self.commands().items():
            score = matcher.match(cmd)
            if score > 0:
                yield Hit(score, matcher.highlight(cmd), partial(self.app.execute, cmd), help=does)


class CommandsMixin:
    """`execute(text)` for the app: parse one command line and call the app's actions."""

    def execute(self, text: str) -> None:
        """Run one command line (`step 3`, `plan zero2 dp=2`, ...); errors become notifications."""
        try:
            cmd = parse(text)
        except CommandError as e:
            self.notify(str(e), title="command", severity="error")
            return
        a = cmd.args
        if cmd.verb == "quit":
            self.action_quit()
        elif cmd.verb == "help":
            self.action_help()
        elif cmd.verb == "plan":
            if not self.engine_ready:
                self.notify("the engine is still loading (torch): try again in a second")
                return
            fields = dict(a["fields"])
            self.launch_world(a["preset"], fields.pop("model", "tiny"), fields)
        elif cmd.verb in ("launch", "reset"):
            if self.run_screen() is None and cmd.verb == "launch":
                self.setup_screen.action_launch()
            else:
                self.action_reset()
        elif cmd.verb == "step":
            self.action_step(a["n"])
        elif cmd.verb == "run":
            if not self.busy:
                self.action_run_or_pause(a["n"])
        elif cmd.verb == "pause":
            self.pause_requested = True
        elif cmd.verb == "show":
            rs = self.run_screen()
            if rs is None:
                self.notify("launch a world first: show reads a rank's snapshot")
            elif not 0 <= a["rank"] < len(rs.infos):
                self.notify(f"rank {a['rank']} is outside the world of {len(rs.infos)}: pick "
                            f"0..{len(rs.infos) - 1}", severity="error")
            else:
                rs.select(a["rank"], what=a["what"], name=a["name"])
        elif cmd.verb == "trace":
            self._trace(a["action"], a.get("name", ""))
        elif cmd.verb == "report":
            self._report_worker()
        elif cmd.verb == "link":
            self._link(a["text"], a["ranks_per_node"])
        elif cmd.verb in ("save", "load"):
            self._checkpoint(cmd.verb, a["path"])
        elif cmd.verb == "map":
            self._reshard_map_worker(a["path"])
        elif cmd.verb == "doctor":
            if not self.world.launched:
                self.notify("launch a world first: doctor reads its ranks' flight records")
            elif self._begin():
                self._doctor_worker()
        elif cmd.verb == "slow":
            if not self.world.launched:
                self.notify("launch a world first: slow acts on its running ranks")
            elif self._begin():
                self._slow_worker(a)

    def _checkpoint(self, verb: str, path: str) -> None:
        if not self.world.launched:
            self.notify(f"launch a world first: {verb} acts on its running ranks")
        elif self._begin():
            self._checkpoint_worker(verb, path)

    @work(thread=True, group="world")
    def _checkpoint_worker(self, verb: str, path: str) -> None:
        """World.save / World.load between steps (partui.checkpoints.checkpoint)."""
        try:
            said = (f"saved {self.world.save(path)}" if verb == "save" else
                    f"resumed at step {self.world.load(path)} from {path}")
            self.call_from_thread(self.notify, said, title=verb)
        except (ValueError, RankError, WorldTimeout) as e:
            self.call_from_thread(self.notify, str(e), title=verb, severity="error")
        finally:
            self.call_from_thread(self._step_done)

    @work(thread=True, group="map")
    def _reshard_map_worker(self, path: str) -> None:
        """`partui plan --resume`'s map of a checkpoint onto the planned world (nothing loaded)."""
        try:
            plan, cfg = self.world.current_plan, self.world.cfg
            if plan is None:
                raise ValueError("plan a world first: the map shows a checkpoint onto a plan")
            ckpt, man = check_resume(path, plan, cfg, {})
            from partui.checkpoints.reshard_map import reshard_map, reshard_text   # torch: dry engines
            text = reshard_text(reshard_map(ckpt, plan, cfg), Plan.from_dict(man["plan"]).describe(),
                                plan.describe())
            self.call_from_thread(self.push_screen, TextDialog(f"reshard map of {ckpt}", text))
        except (ValueError, OSError) as e:
            self.call_from_thread(self.notify, str(e), title="map", severity="error")

    @work(thread=True, group="world")
    def _doctor_worker(self) -> None:
        """World.doctor: the flight recorder's verdict and each rank's last ops, now."""
        try:
            verdict = self.world.doctor("asked from the app")
            dump = getattr(self.world, "last_flight", None)
            timeline = "\n".join(last_ops(dump)) if dump else ""
            self.call_from_thread(self.push_screen, TextDialog("doctor", f"{verdict}\n\n{timeline}"))
        except (RuntimeError, RankError, WorldTimeout, OSError) as e:
            self.call_from_thread(self.notify, str(e), title="doctor", severity="error")
        finally:
            self.call_from_thread(self._step_done)

    def _link(self, text, ranks_per_node) -> None:
        """Switch the emulated link between steps (a launched world), or set it for the next."""
        try:
            if not self.world.launched:
                self.world.set_link(text, ranks_per_node)
                self.notify(f"link for the next launch: {text or 'none'}")
                return
        except ValueError as e:
            self.notify(str(e), title="link", severity="error")
            return
        if self._begin():
            self._link_worker(text, ranks_per_node)

    @work(thread=True, group="world")
    def _link_worker(self, text, ranks_per_node) -> None:
        try:
            self.world.set_link(text, ranks_per_node)
            self.call_from_thread(self.notify, f"link: {self.world.link_text()}")
        except (ValueError, RankError, WorldTimeout) as e:
            self.call_from_thread(self.notify, str(e), title="link", severity="error")
        finally:
            self.call_from_thread(self._step_done)

    @work(thread=True, group="world")
    def _slow_worker(self, kw: dict) -> None:
        """World.slow between steps (a straggler on purpose; {} clears it)."""
        try:
            self.world.slow(**kw)
            self.call_from_thread(self.notify, f"slow: {self.world.slow_text()}")
        except (ValueError, RankError, WorldTimeout) as e:
            self.call_from_thread(self.notify, str(e), title="slow", severity="error")
        finally:
            self.call_from_thread(self._step_done)
