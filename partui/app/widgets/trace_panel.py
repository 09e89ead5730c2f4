"""The Trace tab: record on / off, save under a name, then the overlap report per rank and per
step (partui.analysis.figures.metrics), what overlap saves under the current link (in flight, saved:
partui.analysis.replay.whatif.saved), a text timeline of the last recorded step, and the file's path; with
overlapped F&B pairs (fb_overlap), each pair's all-to-alls and what they flew under
(partui.analysis.figures.pairs).
Every column is defined once, in partui.analysis.figures.definitions."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Button, DataTable, Input, Static

REPORT_COLS = ("rank", "step", "window_ms", "compute_ms", "comm_ms", "overlapped_ms",
               "exposed_comm_ms", "idle_ms", "overlap_pct", "bubble_pct")
# pipeline runs only, a table of their own so the figures' fit 80 columns beside them
PIPE_COLS = ("rank", "pipe_bubble_pct", "sim_bubble_pct", "sim_ideal_bubble_pct", "formula_bubble_pct")
DEFINED = "the same figures as the step lines, the rank cards and `partui report` (definitions: ?)"
PAIR_COLS = ("rank", "pair", "all_to_all", "in_flight_ms", "under_other_ms", "exposed_ms", "under")
# partui.analysis.replay.whatif.SAVED_COLUMNS (not imported: the analysis loads pandas after the first frame)
SAVED_COLS = ("rank", "comm_in_flight_ms", "blocked_ms", "predicted_step_ms", "no_overlap_step_ms", "saved_ms")


# short headers, so the per-rank table fits 80 columns (the help screen says what each is)
HEADERS = {"overlapped_ms": "ovl", "exposed_comm_ms": "exposed", "overlap_pct": "ovl%",
           "in_flight_ms": "in flight", "comm_in_flight_ms": "in flight",
           "predicted_step_ms": "step", "no_overlap_step_ms": "no-overlap step",
           "pipe_bubble_pct": "pipe%", "sim_bubble_pct": "sim%",
           "sim_ideal_bubble_pct": "ideal%", "formula_bubble_pct": "formula%"}


def header(col: str) -> str:
    return HEADERS.get(col) or col.replace("_ms", "").replace("_pct", "%")


def cell(v, col: str = "", digits: int = 1) -> str:
    if col in ("rank", "step", "pair") and isinstance(v, float) and v == v:
        return str(int(v))   # a step number, not a measurement
    if v is None:
        return "—"
    if isinstance(v, float):
        return "—" if v != v else f"{v:.{digits}f}"
    return str(v)


class TracePanel(VerticalScroll):
    def compose(self) -> ComposeResult:
        with Horizontal(id="trace-bar"):
            yield Button("● record", id="trace-record", compact=True)
            yield Input(placeholder="name", id="trace-name", compact=True)
            yield Button("save", id="trace-save", compact=True)
        yield Static("not recording · record, step, stop (or save): the report appears here",
                     id="trace-path", markup=False)
        yield Static(DEFINED, id="figures-defined", markup=False)
        yield DataTable(id="report-rank", show_cursor=False)
        yield DataTable(id="report-step", show_cursor=False)
        yield DataTable(id="report-pipe", show_cursor=False)
        yield Static("", id="saved-line", markup=False)
        yield DataTable(id="report-saved", show_cursor=False)
        yield Static("", id="pair-summary", markup=False)
        yield DataTable(id="report-pair", show_cursor=False)
        yield Static("", id="timeline")

    def set_recording(self, on: bool) -> None:
        b = self.query_one("#trace-record", Button)
        b.label = "■ stop" if on else "● record"
        b.variant = "error" if on else "default"
        if on:
            self.query_one("#trace-path", Static).update("recording: the next steps are traced")

    def show_report(self, path: str, by_rank, by_step, timeline: Text, pairs=None,
                    pair_line: str = "", about: str = "") -> None:
        """`pairs`: partui.analysis.fb_pair_a2a's table, `pair_line` its pair_summary, shown when it has
        rows; `about`: whose trace it is and when it was saved (World.trace_about)."""
        where = f"{path}  (open in https://ui.perfetto.dev)"
        self.query_one("#trace-path", Static).update(f"{about}\n{where}" if about else where)
        tables = [("#report-rank", by_rank, REPORT_COLS, 1), ("#report-step", by_step, REPORT_COLS, 1)]
        has_pipe = "pipe_bubble_pct" in by_rank.columns
        if has_pipe:
            tables.append(("#report-pipe", by_rank, PIPE_COLS, 1))
        self.query_one("#report-pipe").display = has_pipe
        has_pairs = pairs is not None and len(pairs) > 0
        if has_pairs:                                   # one all-to-all is a fraction of a millisecond
            tables.append(("#report-pair", pairs, PAIR_COLS, 3))
        for tid, df, wanted, digits in tables:
            t = self.query_one(tid, DataTable)
            t.clear(columns=True)
            cols = [c for c in wanted if c in df.columns]
            t.add_columns(*[header(c) for c in cols])
            for row in df[cols].itertuples(index=False):
                t.add_row(*[cell(v, c, digits) for v, c in zip(row, cols)])
        self.query_one("#pair-summary", Static).update(pair_line if has_pairs else "")
        for tid in ("#pair-summary", "#report-pair"):
            self.query_one(tid).display = has_pairs
        self.query_one("#timeline", Static).update(timeline)

    def show_saved(self, table, line: str) -> None:
        """What overlap saves under the current link (partui.analysis.replay.whatif.saved), or only
        `line` saying why there is no table (no link installed)."""
        self.query_one("#saved-line", Static).update(line)
        t = self.query_one("#report-saved", DataTable)
        t.clear(columns=True)
        t.display = table is not None
        if table is None:
            return
        t.add_columns(*[header(c) for c in SAVED_COLS])
        for row in table[list(SAVED_COLS)].itertuples(index=False):
            t.add_row(*[cell(v, c) for v, c in zip(row, SAVED_COLS)])

    def report_rows(self, which: str = "rank") -> list[list[str]]:
        """Rows of the rank, step, pipe, saved or pair table as shown."""
        t = self.query_one(f"#report-{which}", DataTable)
        return [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]
