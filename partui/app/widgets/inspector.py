"""The selected rank's tabs: Parameters, Gradients, Optimizer state, and the shard map.
Rows come straight from the rank's snapshot (partui/world/snapshot.py)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, TabbedContent, TabPane

from partui.app.widgets.memory_map import MemoryMap
from partui.app.widgets.routing_map import RoutingMap
from partui.app.widgets.shard_map import ShardMap, piece_label
from partui.app.widgets.trace_panel import TracePanel

TABS = {"params": "tab-params", "grad": "tab-grads", "optim": "tab-optim", "shards": "tab-shards",
        "trace": "tab-trace", "routing": "tab-routing", "memory": "tab-memory"}


def num(x) -> str:
    return "—" if x is None else f"{x:.4g}"


def vals(s: dict | None) -> str:
    return "—" if not s else " ".join(f"{v:.3g}" for v in s["values"])


def param_rows(snap: dict, name: str = "") -> list[tuple]:
    """Params, then state beside them (DeepSeek's selection bias: no grad, no optimizer)."""
    rows = [(p["name"], str(p["global_shape"]), str(p["local_shape"]),
             piece_label(p["kind"], p["index"], p["global_shape"]), num(p["value"]["norm"]),
             vals(p["value"])) for p in snap["params"] if name in p["name"]]
    return rows + [(b["name"], str(b["global_shape"]), str(b["local_shape"]), "state (whole)",
                    num(b["value"]["norm"]), vals(b["value"]))
                   for b in snap.get("state", []) if name in b["name"]]


def grad_piece(p: dict) -> str:
    """Where this rank's gradient sits in the global tensor (ZeRO-2/3: its flat shard)."""
    g = p.get("grad_piece")
    return "not held here" if g is None else piece_label(g["kind"], g["index"], p["global_shape"])


def grad_rows(snap: dict, name: str = "") -> list[tuple]:
    return [(p["name"], grad_piece(p), num(p["grad"] and p["grad"]["norm"]),
             num(p["grad"] and p["grad"]["absmax"]), vals(p["grad"]))
            for p in snap["params"] if name in p["name"]]


def optim_rows(snap: dict, name: str = "") -> list[tuple]:
    rows = []
    for o in snap["optimizer"]:
        if name not in o["name"]:
            continue
        m, v = o["state"].get("m"), o["state"].get("v")
        rows.append((o["name"], piece_label(o["kind"], o["index"], o["global_shape"]),
                     str(o["step"]), num(m and m["norm"]), num(v and v["norm"]), vals(m), vals(v)))
    return rows


COLUMNS = {"params": ("name", "global", "local", "piece", "norm", "values"),
           "grad": ("name", "piece", "norm", "absmax", "values"),
           "optim": ("name", "piece", "step", "m norm", "v norm", "m values", "v values")}
ROWS = {"params": param_rows, "grad": grad_rows, "optim": optim_rows}


class Inspector(Vertical):
    """Tabs over the selected rank's snapshot, plus the trace panel."""

    @property
    def active(self) -> str:
        return self.query_one("#tabs", TabbedContent).active

    @active.setter
    def active(self, tab_id: str) -> None:
        self.query_one("#tabs", TabbedContent).active = tab_id

    def compose(self) -> ComposeResult:
        with TabbedContent(id="tabs"):
            yield from self.panes()

    def panes(self) -> ComposeResult:
        for what, title in (("params", "Params"), ("grad", "Grads"), ("optim", "Optim")):
            with TabPane(title, id=TABS[what]):
                yield DataTable(id=f"table-{what}", zebra_stripes=True, cursor_type="row")
        with TabPane("Shards", id=TABS["shards"]):
            yield ShardMap("highlight a parameter row to see how it is split", id="shard-map")
        with TabPane("Trace", id=TABS["trace"]):
            yield TracePanel(id="trace-panel")
        with TabPane("Routing", id=TABS["routing"]):
            yield RoutingMap("", id="routing-map")
        with TabPane("Memory", id=TABS["memory"]):
            yield MemoryMap("", id="memory-map")

    def on_mount(self) -> None:
        for what, cols in COLUMNS.items():
            self.query_one(f"#table-{what}", DataTable).add_columns(*cols)

    def fill(self, snap: dict, name_filter: str = "") -> None:
        for what, fn in ROWS.items():
            table = self.query_one(f"#table-{what}", DataTable)
            row = table.cursor_row
            table.clear()
            for r in fn(snap, name_filter):
                table.add_row(*r, key=r[0])
            if table.row_count:
                table.move_cursor(row=min(row, table.row_count - 1))

    def rows(self, what: str) -> list[list[str]]:
        """The table's cells as strings (what a user reads; used by tests)."""
        t = self.query_one(f"#table-{what}", DataTable)
        return [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]
