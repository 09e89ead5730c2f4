"""`partui report --by schedule`: a recorded 1F1B step (pp 2, 2 microbatches) against the simulator
under the trace's own costs, on a hand-built trace whose lateness and causes are known."""
import pytest

from partui.analysis import TraceError, load
from partui.analysis.figures.schedule_view import schedule_view
from partui.cli import main
from test_analysis import X, write


def act(rank, name, ts, dur, cpu, mb):
    cat = "F" if name.startswith("F") else "B"
    return X(rank, name, cat, ts, dur, mb=mb, chunk=0, cpu_us=float(cpu))


def one_f_one_b():
    """F = 10, BW = 20 us everywhere, so the ideal is: rank 0 F0 [0,10] F1 [10,20] BW0 [40,60]
    BW1 [70,90]; rank 1 F0 [10,20] BW0 [20,40] F1 [40,50] BW1 [50,70]. Recorded: rank 0's BW0 got
    half its CPU (no core 10), its BW1 starts 5 late; rank 1's BW1 waits 5 for its input first."""
    ev = [X(r, "step", "step", 0, 100, step=3) for r in (0, 1)]
    ev += [act(0, "F mb0 c0", 0, 10, 10, 0), act(0, "F mb1 c0", 10, 10, 10, 1),
           act(0, "BW mb0 c0", 40, 20, 10, 0), act(0, "BW mb1 c0", 75, 20, 20, 1),
           act(1, "F mb0 c0", 10, 10, 10, 0), act(1, "BW mb0 c0", 20, 20, 20, 0),
           act(1, "F mb1 c0", 40, 10, 10, 1), act(1, "BW mb1 c0", 50, 25, 20, 1),
           X(1, "wait recv", "wait", 50, 5, op="recv")]
    return ev


@pytest.fixture
def trace(tmp_path):
    return write(tmp_path, one_f_one_b(), plan={"pp": 2, "schedule": "1f1b", "microbatches": 2},
                 coords={"0": "pp0", "1": "pp1"})


def test_lateness_and_why_against_the_ideal_schedule(trace):
    v = schedule_view(load(trace)).set_index(["rank", "k"])
    assert v["sim_start_ms"].tolist() == pytest.approx([0, .010, .040, .070, .010, .020, .040, .050])
    assert v["late_ms"].tolist() == pytest.approx([0, 0, 0, .005, 0, 0, 0, 0])
    assert v.loc[(0, 2), "why"] == "a core" and v.loc[(0, 2), "no_core_ms"] == pytest.approx(.010)
    assert v.loc[(0, 3), "why"] == "nothing"        # ran its cost; its lateness came from before
    assert v.loc[(1, 3), "why"] == "a peer's send" and v.loc[(1, 3), "waited_ms"] == pytest.approx(.005)
    assert v.loc[(1, 0), "action"] == "F mb0 c0"


def test_cli_and_bad_input(trace, tmp_path, capsys):
    assert main(["report", trace, "--by", "schedule"]) == 0
    out = capsys.readouterr().out
    assert "late_ms" in out and "  why: --by schedule: a peer's send, a core" in out
    assert main(["report", trace, "--by", "schedule", "--step", "7"]) == 2
    assert "step 7 is not in this trace; pick one of its steps (3)" in capsys.readouterr().err
    with pytest.raises(TraceError, match="no pipeline schedule"):
        schedule_view(load(write(tmp_path, [X(0, "step", "step", 0, 9, step=0)], "flat.json")))
