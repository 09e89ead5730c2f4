"""`partui bench analysis`'s report-vs-HTA case: HTA run in whichever python has it (--hta-python,
$PARTUI_HTA_PYTHON, else this one), a python that cannot import hta refused in one line naming the
fix, and each side timed as its own whole process. HTA itself is stood in for by a module of the
same name whose get_comm_comp_overlap returns a known frame, so the test needs no HTA install."""
from __future__ import annotations

import os
import stat
import sys

import pytest

from partui.bench import analysis, analysis_torch
from partui.bench.analysis import synthetic_kineto
from partui.recording.tracefile import write_atomic

FAKE_HTA = '''import os, pandas as pd
class TraceAnalysis:
    def __init__(self, trace_dir):
        self.files = sorted(os.listdir(trace_dir))
    def get_comm_comp_overlap(self):
        assert self.files == ["rank0.json"], self.files
        return pd.DataFrame({"rank": [0], "comp_comm_overlap_pctg": [12.5]})
'''


@pytest.fixture
def fake_hta(tmp_path, monkeypatch):
    """A folder holding a package `hta` with trace_analysis.TraceAnalysis, on PYTHONPATH."""
    pkg = tmp_path / "site" / "hta"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "trace_analysis.py").write_text(FAKE_HTA)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]))
    return sys.executable


def test_a_python_without_hta_or_no_python_at_all_is_refused_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.chdir(tmp_path)  # this checkout's folder is not on the child's path: no hta anywhere
    with pytest.raises(ValueError, match=r"--hta-python /no/such/python: no executable file there; point "
                                         r"--hta-python at a venv's bin/python where HTA is installed"):
        analysis_torch.checked_hta_python("/no/such/python")
    text = tmp_path / "notes.txt"
    text.write_text("not a program")
    text.chmod(text.stat().st_mode & ~stat.S_IXUSR)
    with pytest.raises(ValueError, match="no executable file there"):
        analysis_torch.checked_hta_python(str(text))
    with pytest.raises(ValueError, match=r"\$PARTUI_HTA_PYTHON .*: it cannot import hta \(ModuleNotFoundError"):
        analysis_torch.checked_hta_python(sys.executable, "$PARTUI_HTA_PYTHON")


def test_the_bench_refuses_a_bad_hta_python_before_any_case_runs(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_:
        analysis.main(["1000", "--hta-python", "/no/such/python"])
    assert exit_.value.code == 2
    assert "argument --hta-python: no executable file there" in capsys.readouterr().err
    monkeypatch.setenv("PARTUI_HTA_PYTHON", "/no/such/python")
    monkeypatch.setattr(analysis, "run_all", lambda *a: pytest.fail("the cases ran"))
    assert analysis.main(["1000", "--big-gb", "0", "--real", __file__]) == 2
    assert "$PARTUI_HTA_PYTHON /no/such/python: no executable file there" in capsys.readouterr().err


def test_the_hta_python_is_the_flag_then_the_variable_then_this_one_when_it_has_hta(fake_hta, monkeypatch):
    assert analysis_torch.find_hta_python("/given") == "/given"
    monkeypatch.setenv("PARTUI_HTA_PYTHON", fake_hta)
    assert analysis_torch.find_hta_python() == os.path.abspath(fake_hta)
    monkeypatch.delenv("PARTUI_HTA_PYTHON")
    monkeypatch.setattr(sys, "path", [os.environ["PYTHONPATH"].split(os.pathsep)[0]] + sys.path)
    assert analysis_torch.find_hta_python() == sys.executable  # this interpreter imports (the stand-in) hta


def test_report_and_hta_each_run_as_their_own_process_and_the_ratio_is_theirs(fake_hta, tmp_path):
    trace = str(tmp_path / "rank.json")
    write_atomic(trace, synthetic_kineto(200))
    got = analysis_torch.report_vs_hta(trace, str(tmp_path), fake_hta, timeout_s=300)
    for side in ("partui", "partui_import", "hta", "hta_import"):
        assert got[side]["wall_s"] > 0 and got[side]["cpu_s"] > 0 and got[side]["rss_mb"] > 10, side
    assert '"comp_comm_overlap_pctg":{"0":12.5}' in got["hta"]["out"]  # the stand-in ran on the trace's folder
    assert '"definitions"' in got["partui"]["out"]  # partui's json report
    text = analysis_torch.describe_vs_hta(trace, got)
    ratio = got["partui"]["wall_s"] / got["hta"]["wall_s"]
    assert f"partui / HTA: {ratio:.2f} wall" in text and "(goal <= 0.25)" in text
    alone = analysis_torch.describe_vs_hta(trace, {k: got[k] for k in ("partui", "partui_import")})
    assert "HTA is not installed here: no ratio" in alone


def test_a_process_past_its_deadline_is_killed_and_named():
    with pytest.raises(RuntimeError, match="ran past 1 s"):
        analysis_torch.whole_process([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1)
