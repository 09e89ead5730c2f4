"""The Trace tab's F&B pair table: shown with the pair summary when a trace has overlapped pairs, hidden
when it has none (the rank / step tables as before)."""
import pandas as pd
import pytest
from rich.text import Text
from textual.app import App

from partui.analysis.pairs import COLUMNS, pair_summary
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
