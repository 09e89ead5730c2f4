"""World.step / World.show rows: compact tables in the REPL, DataFrames for scripts (hand-built rows
with known answers)."""
from partui.tables import Rows, show_rows, step_rows

LINES = [{"step": 0, "loss": 5.5451, "step_ms": 12.0,
          "ranks": [{"compute_ms": 8.0, "comm_ms": 3.0, "overlap_ms": 1.0},
                    {"compute_ms": 9.5, "comm_ms": 2.0, "overlap_ms": 1.5}]},
         {"step": 1, "loss": 5.25, "step_ms": 10.0,
          "ranks": [{"compute_ms": 7.0, "comm_ms": 1.0, "overlap_ms": 0.5},
                    {"compute_ms": 6.0, "comm_ms": 4.0, "overlap_ms": 2.0}]}]


def test_step_rows_print_one_line_per_step_and_convert():
    rows = step_rows(LINES)
    assert rows == LINES and rows[1]["loss"] == 5.25         # still the plain dicts
    text = repr(rows).splitlines()
    assert text[0] == "steps (2 rows; .to_pandas() for a DataFrame)"
    assert text[1].split() == ["step", "loss", "step_ms", "compute_ms", "comm_ms", "overlap_ms"]
    assert text[2].split() == ["0", "5.545", "12", "9.5", "3", "1.5"]   # slowest rank's figures
    assert len(text) == 4
    df = rows.to_pandas()
    assert list(df["loss"]) == [5.5451, 5.25] and list(df["comm_ms"]) == [3.0, 4.0]


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
    assert df.to_dict("records") == [{"name": "wq", "piece": "[0:4, :]", "step": 2, "m_norm": 0.125,
                                      "v_norm": 1e-6}]
    assert repr(Rows([], {"a": len})) == "a"


def test_repl_banner_lists_what_to_try():
    from partui.commands.repl import BANNER
    for call in ('w.plan("zero2", dp=2)', "w.launch()", "w.step(3)", 'w.show(1, "optim")',
                 "w.step(3).to_pandas()", "w.report()"):
        assert call in BANNER, call
