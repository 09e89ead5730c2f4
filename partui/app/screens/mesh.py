"""The setup screen's Mesh view: the planned world before it launches, each rank as the world will
build it (partui.world.layout, what `partui plan` prints): coordinates, groups, experts, memory ledger,
stages and layers."""
from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Static


class MeshScreen(ModalScreen):
    BINDINGS = [Binding("escape,q", "dismiss", "close"),
                Binding("right", "scroll_table(16)", "scroll right", show=False),
                Binding("left", "scroll_table(-16)", "scroll left", show=False)]

    def __init__(self, plan, cfg):
        super().__init__()
        self.plan, self.cfg = plan, cfg
        self.rows: list[list[str]] = []   # what the table shows (tests read it)

    def compose(self) -> ComposeResult:
        with Vertical(id="mesh-box", classes="dialog"):
            yield Static(f"{self.plan.describe()} · world {self.plan.world} · each rank as the "
                         f"world will build it (memory: MiB per rank)", id="mesh-title")
            yield Static("", id="mesh-hint", markup=False)
            with VerticalScroll(classes="dialog-body"):   # the Close button stays on screen
                yield DataTable(id="mesh-table", show_cursor=False)   # first: roles run long
                yield Static("working out each rank's layout ...", id="mesh-roles", markup=False)
            yield Button("Close (esc)", id="mesh-close", compact=True)

    def on_mount(self) -> None:
        self.app.clear_notifications()   # no toast over the table
        self.compute()

    @work(thread=True)
    def compute(self) -> None:
        # lazy: the layout builds each rank's engine (torch), loaded after the app's first frame
        from partui.world.layout import layout_rows, plan_layout
        try:
            ranks = plan_layout(self.plan, self.cfg)
        except Exception as e:  # noqa: BLE001 - shown in the view; the app stays usable
            self.app.call_from_thread(self.query_one("#mesh-roles", Static).update,
                                      f"the layout failed: {e}")
            return
        head, rows = layout_rows(self.plan, ranks)
        roles = "\n".join(f"rank {r['rank']} ({r['label']}): {r['role']}" for r in ranks)
        self.app.call_from_thread(self.show, head, rows, roles)

    def show(self, head: list[str], rows: list[list[str]], roles: str) -> None:
        table = self.query_one("#mesh-table", DataTable)
        table.add_columns(*head)
        for row in rows:
            table.add_row(*row)
        self.rows = rows
        self.query_one("#mesh-roles", Static).update(roles)
        self.call_after_refresh(self.hint_scroll)

    def action_scroll_table(self, cells: int) -> None:
        table = self.query_one("#mesh-table", DataTable)
        table.scroll_to(x=table.scroll_x + cells, animate=False)

    def hint_scroll(self) -> None:
        """Say so when the table is wider than the screen: its last columns are a scroll away."""
        table = self.query_one("#mesh-table", DataTable)
        hidden = table.virtual_size.width > table.scrollable_content_region.width
        last = table.ordered_columns[-1].label.plain if table.ordered_columns else ""
        self.query_one("#mesh-hint", Static).update(
            f"wider than the screen: ← → scroll the table (to {last})" if hidden else "")

    def on_button_pressed(self, _event) -> None:
        self.dismiss()
