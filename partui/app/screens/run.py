"""Run: step / run / pause / reset, the loss curve, a card per rank, and the selected rank's
Parameters / Gradients / Optimizer / Shard map / Trace tabs. Every number is from a snapshot,
a step summary or the trace analysis."""
from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Sparkline, Static

from partui.app.widgets.command_line import CommandLine
from partui.app.widgets.inspector import TABS, Inspector
from partui.app.widgets.memory_map import MemoryMap
from partui.app.widgets.rank_card import RankCard
from partui.app.widgets.routing_map import RoutingMap
from partui.app.widgets.shard_map import ShardMap, grad_snaps
from partui.world.show_kinds import LIST_NAMES

STEPPING_AFTER_S = 1.0   # a step in flight this long says so on the status line
LOSS_POINTS = 200   # the loss sparkline's last steps (partui.world.world.LOSSES_KEPT keeps at least these)


class RunScreen(Screen):
    # under 100 columns the cards hide (c shows them) so the tabs' columns fit: screens/style.py
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    BINDINGS = [Binding("s", "app.step(1)", "step"),
                Binding("n", "app.step(10)", "step 10", show=False),
                Binding("r", "app.run_or_pause", "run/pause"),
                Binding("x", "app.reset", "reset", show=False),
                Binding("t", "app.trace_toggle", "trace"),
                Binding("c", "toggle_cards", "cards", show=False),
                Binding("left_square_bracket", "select(-1)", "rank-", show=False),
                Binding("right_square_bracket", "select(1)", "rank+", show=False),
                Binding("colon", "command", "command"), Binding("p", "app.setup", "plan", show=False),
                Binding("question_mark", "app.help", "help")] + [
        Binding(str(i), f"tab('{what}')", f"{what} tab", show=False)
        for i, what in enumerate(TABS, start=1)]    # 1 params ... 5 trace · 6 routing · 7 memory

    def __init__(self, world, infos: list[dict], presets: list[str], snaps: list[dict] | None = None):
        super().__init__()
        self.world, self.infos, self.presets = world, infos, presets
        self.selected = 0
        self.name_filter = ""
        self.snaps = snaps
        self.map_source = "params"   # the table tab the shard map follows
        self.busy_since: float | None = None   # when the step in flight began
        self.note = ""                # the status line's last note (a tick keeps it)

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="run-top"):
            yield Static("", id="run-status")
            yield Sparkline([], id="loss")
        with Horizontal(id="run-body"):
            with VerticalScroll(id="cards"):
                for info in self.infos:
                    yield RankCard(info, id=f"card-{info['rank']}")
            yield Inspector(id="inspector")
        yield CommandLine(self.presets, self.param_names, id="command")
        yield Footer()

    def on_mount(self) -> None:
        self._ticker = self.set_interval(0.5, lambda: self.update_status(self.note), pause=True)
        self.select(0)
        self.update_status()

    # ---------------------------------------------------------------- state shown
    def param_names(self) -> list[str]:
        if not self.snaps:
            return []
        return [p["name"] for p in self.snaps[self.selected]["params"]]

    def cards(self) -> list[RankCard]:
        return list(self.query(RankCard))

    def set_busy(self, busy: bool) -> None:
        """Spinners on the cards, and (the cards may be hidden) the status line's "stepping…"
        with the seconds so far, ticking while a step is in flight."""
        for c in self.cards():
            c.busy = busy
        self.busy_since = time.monotonic() if busy else None
        if busy:
            self._ticker.resume()
        else:
            self._ticker.pause()
            self.update_status()

    def update_status(self, note: str = "") -> None:
        """Two lines (three when long), so nothing falls off at 80 columns: what is happening now
        (recording, the rank shown, steps, loss), then the plan, the link and a note."""
        w = self.world
        plan = w.current_plan
        self.note = note
        losses = w.losses()
        t = Text()
        if not w.launched:
            t.append("world closed: x (reset) relaunches · ", style="bold red")
        if w.recording:
            t.append("● rec · ", style="bold red")
        steps = w.steps_done       # every step since launch; losses are the last LOSSES_KEPT only
        t.append(f"showing rank {self.selected} · {steps} step{'' if steps == 1 else 's'}")
        if losses:
            t.append(f" · loss {losses[-1]:.4f}", style="bold green")
        if self.busy_since is not None and time.monotonic() - self.busy_since >= STEPPING_AFTER_S:
            t.append(f" · stepping… {time.monotonic() - self.busy_since:.0f} s", style="bold yellow")
        t.append("\n")
        t.append(f"{plan.describe()} · {plan.world} rank{'s' if plan.world > 1 else ''}",
                 style="bold")
        if w.link:   # a long link wraps to a third line (#run-top grows), never off the screen
            t.append(f" · link {w.link['name']}" + (f" x{w.link['factor']:.3g}"
                                                     if w.link["factor"] != 1 else ""), style="cyan")
        if note:
            t.append(f" · {note}", style="yellow")
        self.query_one("#run-status", Static).update(t)
        # under three points a sparkline is one solid block: nothing to read yet
        self.query_one("#loss", Sparkline).data = losses[-LOSS_POINTS:] if len(losses) >= 3 else []

    def show_step(self, line: dict | None, snaps: list[dict] | None) -> None:
        if line is not None:
            ledgers = line.get("ledgers") or [None] * len(line["ranks"])  # this step's, per rank
            for c, item, ledger in zip(self.cards(), line["ranks"], ledgers):
                c.update_step(dict(item, ledger=ledger) if ledger else item)
        if snaps is not None:
            self.snaps = snaps
            self.fill_inspector()
        self.query_one(RoutingMap).show(self.world.history)
        self.query_one(MemoryMap).show(self.world.history)
        self.update_status()

    def fill_inspector(self) -> None:
        if self.snaps:
            self.query_one(Inspector).fill(self.snaps[self.selected], self.name_filter)
            self.draw_shard_map()

    def draw_shard_map(self) -> None:
        """The highlighted row's tensor across ranks, as the last table tab shows it: params,
        gradients (ZeRO-2/3 shard them apart from params) or optimizer state."""
        if not self.snaps:
            return
        active = self.query_one(Inspector).active
        self.map_source = next((w for w in LIST_NAMES if TABS[w] == active), self.map_source)
        source = self.map_source
        table = self.query_one(f"#table-{source}", DataTable)
        if not table.row_count:           # this rank holds none of those: its params instead
            source, table = "params", self.query_one("#table-params", DataTable)
        if not table.row_count:
            return
        name = str(table.get_row_at(table.cursor_row)[0])
        what = LIST_NAMES[source]
        snaps = grad_snaps(self.snaps) if what == "grads" else self.snaps
        self.query_one(ShardMap).show(name, snaps, what)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id in ("table-params", "table-grad", "table-optim"):
            self.draw_shard_map()

    # ---------------------------------------------------------------- selection
    def select(self, rank: int, what: str | None = None, name: str | None = None) -> None:
        self.selected = rank
        for c in self.cards():
            c.selected = c.rank == rank
        self.update_status()
        if name is not None:
            self.name_filter = name
        insp = self.query_one(Inspector)
        if what is not None:
            insp.active = TABS[what]
        self.query_one(f"#card-{rank}").scroll_visible()
        self.fill_inspector()

    def action_select(self, delta: int) -> None:
        self.select((self.selected + delta) % len(self.infos))

    def on_rank_card_selected(self, event: RankCard.Selected) -> None:
        self.select(event.rank)

    def action_toggle_cards(self) -> None:
        self.toggle_class("-cards-toggled")

    def action_tab(self, what: str) -> None:
        self.app.clear_notifications()   # the tab asked for is seen whole, no toast over it
        self.query_one(Inspector).active = TABS[what]
        self.draw_shard_map()

    def action_command(self) -> None:
        self.query_one("#command").focus()
