"""The Trace tab: record on / off, save under a name, then the overlap report per rank and per
step (partui.analysis.metrics), a text timeline of the last recorded step, and the file's path."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Button, DataTable, Input, Static

REPORT_COLS = ("rank", "step", "window_ms", "compute_ms", "comm_ms", "overlapped_ms",
               "exposed_comm_ms", "idle_ms", "overlap_pct", "bubble_pct", "no_core_ms",
               "pipe_bubble_pct", "sim_bubble_pct", "formula_bubble_pct")   # pipe_..: pipeline runs only


def cell(v) -> str:
    if isinstance(v, float):
        return "—" if v != v else f"{v:.1f}"
    return str(v)


class TracePanel(VerticalScroll):
    def compose(self) -> ComposeResult:
        with Horizontal(id="trace-bar"):
            yield Button("● record", id="trace-record", compact=True)
            yield Input(placeholder="name", id="trace-name", compact=True)
            yield Button("save", id="trace-save", compact=True)
        yield Static("not recording · record, step, save: the report appears here",
                     id="trace-path", markup=False)
        yield DataTable(id="report-rank", show_cursor=False)
        yield DataTable(id="report-step", show_cursor=False)
        yield Static("", id="timeline")

    def set_recording(self, on: bool) -> None:
        b = self.query_one("#trace-record", Button)
        b.label = "■ stop" if on else "● record"
        b.variant = "error" if on else "default"
        if on:
            self.query_one("#trace-path", Static).update("recording: the next steps are traced")

    def show_report(self, path: str, by_rank, by_step, timeline: Text) -> None:
        self.query_one("#trace-path", Static).update(f"{path}  (open in https://ui.perfetto.dev)")
        for tid, df in (("#report-rank", by_rank), ("#report-step", by_step)):
            t = self.query_one(tid, DataTable)
            t.clear(columns=True)
            cols = [c for c in REPORT_COLS if c in df.columns]
            t.add_columns(*[c.replace("_ms", "").replace("_pct", "%") for c in cols])
            for row in df[cols].itertuples(index=False):
                t.add_row(*[cell(v) for v in row])
        self.query_one("#timeline", Static).update(timeline)

    def report_rows(self, which: str = "rank") -> list[list[str]]:
        t = self.query_one(f"#report-{which}", DataTable)
        return [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]
