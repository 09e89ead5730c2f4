"""The Trace tab's F&B pair table: shown with the pair summary when a trace has overlapped pairs, hidden
when it has none (the rank / step tables as before); its in flight / saved table under the current
link."""
import pandas as pd
import pytest
from rich.text import Text
from textual.app import App

from app_helpers import command, idle, launched, trace_one_step, wait_for
from partui.analysis.figures.pairs import COLUMNS, pair_summary
from partui.app.main import PartuiApp
from partui.app.widgets.trace_panel import TracePanel

pytestmark = pytest.mark.timeout(120)


class PanelApp(App):
    def compose(self):
        yield TracePanel(id="trace-panel")


def _pairs():
    return pd.DataFrame([[0, "FB mb3 c0 / mb1 c0", "DISPATCH(F) L1 mb3", "ATTN F mb3 L1", 0.021, 0.002, 0.008,
                          "COMBINE B mb1 L2"]], columns=COLUMNS)


async def test_pair_table_and_summary_show_only_with_pairs():
    rank = pd.DataFrame({"rank": [0], "window_ms": [1.0]})
    step = pd.DataFrame({"rank": [0], "step": [0.0]})
    app = PanelApp()
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.query_one(TracePanel)
        pairs = _pairs()
        panel.show_report("t.json", rank, step, Text("r0"), pairs, pair_summary(pairs))
        await pilot.pause()
        assert panel.report_rows("pair") == [["0", "FB mb3 c0 / mb1 c0", "DISPATCH(F) L1 mb3", "0.021", "0.002",
                                              "0.008", "COMBINE B mb1 L2"]]
        assert panel.query_one("#report-pair").display and panel.query_one("#pair-summary").display
        assert "F&B pairs: 1 all-to-alls in flight 0.021 ms" in str(panel.query_one("#pair-summary").render())
        panel.show_report("u.json", rank, step, Text("r0"))
        await pilot.pause()
        assert not panel.query_one("#report-pair").display and not panel.query_one("#pair-summary").display


async def test_saved_under_the_current_link_after_a_traced_step():
    """A user sets a link, traces a step: the tab says what overlap saves under it (the saved
    trace replayed with and without overlap), with the definitions; `link off` and the next
    report says there is no link to replay under."""
    app = PartuiApp()
    async with app.run_test(size=(120, 40)) as pilot:
        await launched(app, pilot, "plan zero2 dp=2")
        await command(app, pilot, "link alpha_us=2000,gbps=0.02")
        await idle(app, pilot, "the link")
        panel = await trace_one_step(app, pilot)
        saved = panel.query_one("#report-saved")
        await wait_for(pilot, lambda: saved.row_count == 3, what="the saved table")
        rows = panel.report_rows("saved")
        assert [r[0] for r in rows] == ["0", "1", "step"]
        step, no_ov, sv = (float(v) for v in rows[2][3:6])
        assert sv == pytest.approx(no_ov - step, abs=0.11) and no_ov >= step
        line = str(panel.query_one("#saved-line").render())
        assert "under alpha_us=2000,gbps=0.02" in line and "overlap saves" in line
        assert "no_overlap_step: the rank's step replayed with every send and collective waited" \
            in line.replace("\n", " ")
        await command(app, pilot, "link off")
        await idle(app, pilot, "link off")
        panel = await trace_one_step(app, pilot)
        await wait_for(pilot, lambda: "no emulated link" in str(
            panel.query_one("#saved-line").render()), what="the no-link line")
        assert not panel.query_one("#report-saved").display
        await pilot.press("escape", "q")
