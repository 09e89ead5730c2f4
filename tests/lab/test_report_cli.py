"""`partui report`: every format, --by, --vs, --plot, and bad input (one line on stderr, exit 2)."""
import json

import pytest

from partui.commands import report as cmd_report
from partui.cli import main
from test_analysis import two_ranks, write


@pytest.fixture
def trace(tmp_path):
    return write(tmp_path, two_ranks())


def test_table_csv_json_markdown(trace, capsys):
    assert main(["report", trace]) == 0
    table = capsys.readouterr().out
    assert "exposed_comm_ms" in table and "66.667" in table
    assert "definitions:" in table and "  overlap_pct: overlapped_ms / comm_ms" in table
    assert main(["report", trace, "--format", "csv"]) == 0
    out = capsys.readouterr()
    lines = out.out.strip().splitlines()
    assert lines[0].startswith("rank,window_ms") and len(lines) == 3
    assert "  idle_ms: window covered by neither compute nor comm in flight" in out.err
    assert main(["report", trace, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["bubble_pct"] for r in doc["rows"]] == [40.0, 50.0]
    assert set(doc["rows"][0]) <= set(doc["definitions"]) and "compute" in doc["definitions"]
    assert main(["report", trace, "--format", "markdown", "--by", "op"]) == 0
    md = capsys.readouterr().out.splitlines()
    assert "  exposed_comm_ms: comm_ms - overlapped_ms: comm in flight while the rank did not compute" in md
    assert md[0].startswith("| op | group") and md[1].startswith("|---|")
    assert any(line.startswith("| all_reduce | dp | 1 |") for line in md)


def test_by_step(trace, capsys):
    assert main(["report", trace, "--by", "step", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("rank,step,")


def test_vs_shows_step_time_saved_and_overlap(tmp_path, trace, capsys):
    slower = [dict(e, dur=e["dur"] * 2, ts=e["ts"] * 2) for e in two_ranks()]
    other = write(tmp_path, slower, "other.json")
    assert main(["report", trace, "--vs", other]) == 0
    out = capsys.readouterr().out
    assert "this run saves 0.100 ms a step (50.0% of the other's)" in out
    assert "overlap in flight is not time saved" in out
    assert main(["report", trace, "--vs", other, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["run"] for r in rows] == ["this", "other", "other - this"]
    assert rows[2]["world_step_ms"] == pytest.approx(0.1)


def test_help_documents_every_column(capsys):
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    out = capsys.readouterr().out
    for col in ("pipe_bubble_pct", "no_core_ms", "exposed_comm_ms", "sim_bubble_pct"):
        assert f"  {col} " in out


def test_plot_writes_a_png(tmp_path, trace, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "tl.png"
    assert main(["report", trace, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("content, problem", [
    (None, "no such file"),
    ('{"traceEvents": [', "truncated"),
    ('{"hello": 1}', "not a Chrome trace"),
    ('{"traceEvents": [], "metadata": {"format": "other"}}', "unknown trace format"),
])
def test_bad_input_is_one_line_on_stderr_and_exit_2(tmp_path, capsys, content, problem):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and problem in err


def test_bad_vs_trace_is_named(tmp_path, trace, capsys):
    assert main(["report", trace, "--vs", str(tmp_path / "nope.json")]) == 2
    assert "nope.json: no such file" in capsys.readouterr().err


def test_compare_is_a_python_api(trace):
    from partui.analysis import load
    t = cmd_report.compare(load(trace), load(trace))
    assert t.loc[2, "world_step_ms"] == 0
