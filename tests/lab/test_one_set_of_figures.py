"""One set of figures: for one traced step, the step line (what World.step returns and the rank
card draws), World.step().to_pandas() and `partui report --by step` on the trace of that step count
compute, comm in flight, overlapped and exposed comm the same way (planning.intervals.figures and
partui.analysis.figures.definitions), so they agree within the clocks' rounding."""
import pytest

from partui.app.widgets.rank_card import card_figures
from partui.world.world import World

pytestmark = pytest.mark.timeout(300)

TOL_MS = 0.05   # the engine cuts to its step() call; the trace, to the step span just inside it


@pytest.mark.parametrize("preset, fields", [("dp-bucketed", {}), ("1f1b", {"microbatches": 2})],
                         ids=["dp-bucketed", "1f1b"])
def test_step_line_card_frame_and_report_agree_on_one_traced_step(tmp_path, preset, fields):
    """dp: all-reduces under the backward; 1f1b: p2p pairs, in flight from the send's post to the
    recv's completion on the other rank (paired by the step line, as the trace pairs them)."""
    with World(timeout_s=120) as w:
        w.plan(preset, **fields)
        w.launch()
        w.step(1)                      # warm-up, untraced
        w.trace_on()
        rows = w.step(1)
        w.trace_save(str(tmp_path / "one.json"))
        report = w.report(by="step").set_index("rank")
    frame = rows.to_pandas().set_index("rank")
    line = rows[0]
    assert report["step"].tolist() == [1, 1]
    for rank, item in enumerate(line["ranks"]):
        rep = report.loc[rank]
        assert item["comm_ms"] > 0 and rep["comm_ms"] > 0
        for key, col in (("compute_ms", "compute_ms"), ("comm_ms", "comm_ms"),
                         ("overlapped_ms", "overlapped_ms"), ("exposed_comm_ms", "exposed_comm_ms"),
                         ("wait_ms", "wait_ms"), ("window_ms", "window_ms")):
            assert item[key] == pytest.approx(rep[col], abs=TOL_MS), (rank, key)
            assert frame.loc[rank, col] == item[key]
        assert frame.loc[rank, "overlap_pct"] == pytest.approx(rep["overlap_pct"], abs=5.0)
        card = card_figures(item)     # the card prints the step line's figures
        assert f"ovl {item['overlapped_ms']:.1f}" in card and f"comp {item['compute_ms']:.1f}" in card
    assert "leaf spans" in frame.attrs["definitions"]["compute"]
