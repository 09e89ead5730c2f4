"""One table of definitions (partui.analysis.figures.definitions): every column a report, a frame or the
app prints has exactly one record there, no other module keeps a table of its own, and the two
figures that once shared the name exposed_comm_ms differ on a hand-built trace as their
definitions say."""
import ast
import json
from pathlib import Path

import pytest

from planning.link import build_link
from partui.analysis import hta_overlap, load, overlap, overlap_views, step_times
from partui.analysis.replay.blame import FIGURES as BLAME_FIGURES
from partui.analysis.replay.blame import analyse
from partui.analysis.figures.definitions import (FIGURES, REPORT, SAVED, TERMS, WHATIF, definitions,
                                                 definitions_of, figure_of, help_text, legend)
from partui.analysis.gpu.pair_parts import COLUMNS as KINETO_PAIR_COLUMNS
from partui.analysis.figures.memory import KINDS
from partui.analysis.figures.pairs import COLUMNS as PAIR_COLUMNS
from partui.analysis.replay.partui_graph import partui_graphs
from partui.analysis.figures.routing import routing_table
from partui.analysis.figures.streams import GPU_COLUMNS, STREAM_COLUMNS, gpu_overlap, stream_busy
from partui.analysis.replay.whatif import SAVED_COLUMNS, replay, saved
from partui.analysis.replay.whatif_pipe import STAGE_COLUMNS
from partui.analysis.replay.whatif_recompute import COLUMNS as RECOMPUTE_COLUMNS
from partui.app.widgets.trace_panel import PAIR_COLS, PIPE_COLS, REPORT_COLS, SAVED_COLS
from partui.bench.analysis import synthetic_trace
from partui.commands.report_vs import compare
from partui.world.tables import show_rows, step_rows

ROOT = Path(__file__).resolve().parents[2]


def X(rank, name, cat, ts_ms, dur_ms, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": rank, "tid": tid, "ts": ts_ms * 1e3,
            "dur": dur_ms * 1e3, "args": args}


def all_reduce_doc() -> dict:
    """Two ranks, one 1 MB all-reduce. Rank 0 computes 0-2 ms, issues at 2 ms, does host work
    (no compute span) until it waits at 5 ms (0.1 ms), computes 5.1-6 ms. Rank 1 computes 0-4 ms,
    issues at 4 ms and waits at once until 5.1 ms, computes 5.1-6 ms."""
    ar = dict(op="all_reduce", group="dp", bytes=1_000_000, peer=None)
    names = [{"ph": "M", "name": "thread_name", "pid": r, "tid": t, "args": {"name": n}}
             for r in (0, 1) for t, n in ((1, "compute"), (2, "comm"))]
    return {"traceEvents": names + [
        X(0, "step", "step", 0, 6, step=0), X(1, "step", "step", 0, 6, step=0),
        X(0, "F", "F", 0, 2, step=0, mb=0), X(0, "B", "B", 5.1, 0.9, step=0, mb=0),
        X(1, "F", "F", 0, 4, step=0, mb=0), X(1, "B", "B", 5.1, 0.9, step=0, mb=0),
        X(0, "all_reduce", "comm", 2, 3.1, tid=2, op_id=1, **ar),
        X(0, "wait all_reduce", "wait", 5, 0.1, op_id=1, op="all_reduce"),
        X(1, "all_reduce", "comm", 4, 1.1, tid=2, op_id=7, **ar),
        X(1, "wait all_reduce", "wait", 4, 1.1, op_id=7, op="all_reduce"),
    ], "metadata": {"format": "partui-trace/1"}}


def test_exposed_comm_and_blocked_differ_as_defined(tmp_path):
    path = tmp_path / "ar.json"
    path.write_text(json.dumps(all_reduce_doc()))
    report = overlap(load(str(path)), "rank").set_index("rank")
    # comm in flight while the rank did not compute: rank 0's op flew 2-5.1 ms beside no compute
    # span (its host work is not compute); rank 1's 4-5.1 ms while it waited
    assert report["exposed_comm_ms"].tolist() == pytest.approx([3.1, 1.1])
    link = build_link("alpha_us=0,gbps=1")   # 2 ranks: 2 * (1/2) * 1e6 B / 1e9 B/s = 1 ms
    replayed = replay(all_reduce_doc(), link, link_only=True).set_index("rank")   # the link alone
    # blocked in waits in the replay: the op runs 4-5 ms from the last issue; rank 0 waits at
    # 5 ms, when it has ended (0); rank 1 waits from its issue at 4 ms (1 ms)
    assert replayed["blocked_ms"].tolist() == pytest.approx([0.0, 1.0])
    assert replayed["comm_in_flight_ms"].tolist() == pytest.approx([3.0, 1.0])
    assert "exposed_comm_ms" not in replayed and "blocked_ms" not in report
    words = definitions_of(["exposed_comm_ms", "blocked_ms"])
    assert words["exposed_comm_ms"].startswith("comm_ms - overlapped_ms: comm in flight while")
    assert words["blocked_ms"].startswith("time the rank blocks in waits in the replay")


def emitted_columns(tmp_path) -> dict[str, list]:
    """{where: the columns it prints} for every report view, frame and app table."""
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps(synthetic_trace(400, ranks=4)))
    df = load(str(path))
    views = overlap_views(df)
    ar = tmp_path / "ar.json"
    ar.write_text(json.dumps(all_reduce_doc()))
    lines = [{"step": 0, "loss": 5.0, "step_ms": 2.0, "max_abs_grad_err": 0.0,
              "ranks": [{"window_ms": 2.0, "compute_ms": 1.0, "comm_ms": 1.0, "overlapped_ms": 0.5,
                         "exposed_comm_ms": 0.5, "wait_ms": 0.0}]}]
    shown = {what: list(show_rows([], what).to_pandas().columns) for what in ("params", "grad", "optim")}
    routing = {0: {"0": {"tokens_per_expert": [3, 1], "max_violation": 0.5, "dropped": 0,
                         "dead_experts": [], "balance_loss": 0.01, "bias": [0.0, 0.1]}}}
    blamed = analyse(partui_graphs(all_reduce_doc()))
    blame = [c for frame in blamed.values() for c in frame.columns] + list(blamed["summary"]["figure"])
    return {**{f"report --by {k}": list(v.columns) for k, v in views.items()},
            "report --vs": list(compare(load(str(ar)), load(str(ar))).columns),
            "report --memory": ["rank", "peak_mib", "peak_at"] + [f"{k}_mib" for k in KINDS],
            "report --routing": list(routing_table(routing).columns),
            "report --by pair": PAIR_COLUMNS + KINETO_PAIR_COLUMNS,
            "report (GPU)": GPU_COLUMNS + STREAM_COLUMNS + ["family", "kernels", "kernel_ms",
                                                           "comm_comp_overlap_pct"],
            "step lines": list(step_rows(lines).to_pandas().columns),
            **{f"World.show {k}": v for k, v in shown.items()},
            "whatif": list(replay(all_reduce_doc(), build_link("alpha_us=0,gbps=1")).columns)
            + ["measured_step_ms", "error_pct"],
            "whatif --pp": list(STAGE_COLUMNS), "whatif --recompute": list(RECOMPUTE_COLUMNS),
            "saved": list(saved(all_reduce_doc(), build_link("alpha_us=0,gbps=1")).columns),
            "blame": blame + list(BLAME_FIGURES),
            "Trace tab": list(REPORT_COLS + PIPE_COLS + PAIR_COLS + SAVED_COLS)}


def test_the_analysis_frames_carry_their_definitions(tmp_path):
    path = tmp_path / "ar.json"
    path.write_text(json.dumps(all_reduce_doc()))
    df = load(str(path))
    link = build_link("alpha_us=0,gbps=1")
    frames = [overlap(df, "rank"), step_times(df), hta_overlap(df), gpu_overlap(df), stream_busy(df),
              replay(all_reduce_doc(), link), saved(all_reduce_doc(), link)]
    for frame in frames:
        words = frame.attrs["definitions"]
        assert list(frame.columns) and all(words[c] == FIGURES[c].definition for c in frame.columns)
    assert overlap(df, "rank").attrs["definitions"]["exposed_comm_ms"] != \
        replay(all_reduce_doc(), link).attrs["definitions"]["blocked_ms"]


def test_every_column_printed_has_one_record(tmp_path):
    emitted = emitted_columns(tmp_path)
    undefined = {where: [c for c in cols if figure_of(c) is None] for where, cols in emitted.items()}
    assert not any(undefined.values()), undefined
    assert {"sim_bubble_pct", "pipe_ms", "no_core_ms"} <= set(emitted["report --by rank"])
    assert "e1" in emitted["report --routing"] and figure_of("e1") is FIGURES["eN"]


def test_the_trace_tab_shows_the_saved_tables_columns_and_the_legends_read_the_table():
    assert SAVED_COLS == SAVED_COLUMNS
    assert legend(["rank", "exposed_comm_ms", "e0", "e1"]) == (
        ["definitions:"] + [f"  {k}: {v}" for k, v in definitions_of(TERMS).items()]
        + [f"  rank: {FIGURES['rank'].counts}", f"  exposed_comm_ms: {FIGURES['exposed_comm_ms'].counts}",
           f"  eN: --routing: {FIGURES['eN'].counts}"])
    assert set(definitions(["saved_ms", "not a figure"])) == set(TERMS) | {"saved_ms"}
    with pytest.raises(ValueError, match="no definition for not_a_figure: add a figure"):
        definitions_of(["blocked_ms", "not_a_figure"])
    report, whatif = help_text(REPORT), help_text(WHATIF)
    assert "exposed_comm_ms" in report and "blocked_ms" not in report
    assert "blocked_ms" in whatif and "exposed_comm_ms  " not in whatif
    assert set(FIGURES["saved_ms"].views) == {SAVED}


def figure_tables(path: Path) -> list[tuple[int, int]]:
    """(line, how many figure names it defines) of each dict literal in a source file that maps
    two or more figure names to prose (a table of definitions)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Dict):
            continue
        prose = [k.value for k, v in zip(node.keys, node.values)
                 if isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value in FIGURES
                 and isinstance(v, ast.Constant) and isinstance(v.value, str) and len(v.value) > 25]
        if len(prose) >= 2:
            out.append((node.lineno, len(prose)))
    return out


def test_no_second_table_of_definitions():
    found = {str(p.relative_to(ROOT)): t for top in ("partui", "planning", "kernels")
             for p in sorted((ROOT / top).rglob("*.py")) if (t := figure_tables(p))}
    assert found == {}, f"definitions live in partui/analysis/figures/definitions.py only: {found}"
