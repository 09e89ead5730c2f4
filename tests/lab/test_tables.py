"""World.step / World.show rows: compact tables in the REPL, DataFrames for scripts (hand-built rows
with known answers)."""
from partui.world.tables import Rows, show_rows, step_rows

def _rank(window_ms, compute, comm, overlapped, wait=0.0):
    return {"window_ms": window_ms, "compute_ms": compute, "comm_ms": comm, "overlapped_ms": overlapped,
            "exposed_comm_ms": comm - overlapped, "wait_ms": wait}


LINES = [{"step": 0, "loss": 5.5451, "step_ms": 12.0,
          "ranks": [_rank(11.0, 8.0, 3.0, 1.5), _rank(12.0, 9.5, 2.0, 1.5)]},
         {"step": 1, "loss": 5.25, "step_ms": 10.0,
          "ranks": [_rank(10.0, 7.0, 0.0, 0.0), _rank(9.0, 6.0, 4.0, 2.0)]}]


def test_step_rows_print_one_line_per_step_and_rank_and_convert():
    rows = step_rows(LINES)
    assert rows == LINES and rows[1]["loss"] == 5.25         # still the plain dicts
    text = repr(rows).splitlines()
    assert text[0] == "steps (4 rows; .to_pandas() for a DataFrame)"
    assert text[1].split() == ["step", "rank", "loss", "step_ms", "window_ms", "compute_ms", "comm_ms",
                               "overlapped_ms", "exposed_comm_ms", "wait_ms", "overlap_pct"]
    assert text[2].split() == ["0", "0", "5.545", "12", "11", "8", "3", "1.5", "1.5", "0", "50"]
    assert text[4].split()[-1] == "—"                         # no comm: no overlap %
    assert len(text) == 6
    df = rows.to_pandas()
    assert list(df["loss"]) == [5.5451, 5.5451, 5.25, 5.25] and list(df["comm_ms"]) == [3, 2, 0, 4]
    assert list(df["overlap_pct"][[0, 1, 3]]) == [50.0, 75.0, 50.0]
    defs = df.attrs["definitions"]   # what each column counts rides along with the frame
    assert "leaf spans" in defs["compute"] and defs["exposed_comm_ms"].startswith("comm_ms - overlapped_ms")
    assert set(df.columns) <= set(defs)


def test_show_rows_name_each_piece():
    grads = [{"name": "wq", "global_shape": [8, 8], "grad_piece": {"kind": "flat", "index": [0, 32]},
              "grad": {"norm": 0.5, "absmax": 0.25}},
             {"name": "wk", "global_shape": [4, 8], "grad_piece": None, "grad": None}]
    text = repr(show_rows(grads, "grad", "rank 1 grad")).splitlines()
    assert text[2].split() == ["wq", "flat", "[0:32]", "0.5", "0.25"]
    assert text[3].split() == ["wk", "not", "held", "here", "—", "—"]
    optim = [{"name": "wq", "kind": "slice", "index": [[0, 4], [0, 8]], "global_shape": [8, 8],
              "step": 2, "state": {"m": {"norm": 0.125},
                                                              "v": {"norm": 1e-6}}}]
    df = show_rows(optim, "optim").to_pandas()
    assert df.to_dict("records") == [{"name": "wq", "piece": "[0:4, :]", "optimizer_steps": 2, "m_norm": 0.125,
                                      "v_norm": 1e-6}]
    assert set(df.attrs["definitions"]) >= set(df.columns)
    assert df.attrs["definitions"]["optimizer_steps"].startswith("the steps AdamW has taken")
    assert repr(Rows([], {"a": len})) == "a"


def test_repl_banner_lists_what_to_try():
    from partui.commands.repl import BANNER
    for call in ('w.plan("zero2", dp=2)', "w.launch()", "w.step(3)", 'w.show(1, "optim")',
                 "w.step(3).to_pandas()", "w.report()"):
        assert call in BANNER, call


def test_summary_figures_average_the_kept_rows_past_the_warm_up():
    from partui.world.results import rank_figures
    kept = [{"step": 0}] + LINES   # a World's older lines keep no per-rank rows (partui.world.world.past)
    figures, steps = rank_figures(kept)
    assert steps == [1]            # step 0 has rows too, but is the warm-up
    assert figures[1] == {"rank": 1, "compute_ms": 6.0, "comm_ms": 4.0, "overlapped_ms": 2.0,
                          "exposed_comm_ms": 2.0, "wait_ms": 0.0, "overlap_pct": 50.0}
    assert rank_figures([{"step": 0}]) == ([], [])
