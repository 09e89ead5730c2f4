"""The README's test command is exactly what .ci/run runs; its examples run as written."""
import os
import re
import subprocess
import sys

from conftest import ROOT, run_cli


def test_ci_runs_the_readme_test_command():
    readme = open(os.path.join(ROOT, "README.md")).read()
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    cmd = 'pip install -q -e ".[test]" && python -m pytest -q'
    assert cmd in readme.split("\n## ")[0], "README must open with the test command"
    assert cmd in ci
    assert "torch==2.13.0" in ci and "venv" in ci


def readme_block(heading: str, lang: str) -> str:
    """The first ```lang block under the README's `## heading`."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return section.split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def test_readme_pandas_example_runs():
    """The README's analysis example, run as a user would paste it, in the repo root."""
    code = readme_block("Analysis in scripts (pandas)", "python")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert out.startswith("dualpipev on 4 ranks: ['dp0 pp0 ep0', 'dp1 pp0 ep1', 'dp0 pp1 ep0',")
    assert "rank  compute_ms  exposed_comm_ms  bubble_pct" in out
    assert "exposed_comm_ms: comm_ms - overlapped_ms: comm in flight while the rank did not compute" in out
    assert "group" in out and "pp " in out and "ep " in out


def test_readme_torchrun_commands_are_valid_plans():
    """Each torchrun command's plan validates (the world-4 one runs in tests/lab/test_torchrun.py);
    the plan's world equals the ranks torchrun starts."""
    block = readme_block("torchrun: one machine or many", "sh").replace("\\\n", " ")
    cmds = [ln.split("-m partui run", 1) for ln in block.splitlines() if "-m partui run" in ln]
    assert len(cmds) == 2
    for launcher, flags in cmds:
        words = launcher.split()
        ranks = int(words[words.index("--nproc-per-node") + 1]) * (
            int(words[words.index("--nnodes") + 1]) if "--nnodes" in words else 1)
        flags = re.sub(r"--steps \d+", "", flags).split()     # a run flag, not a plan flag
        proc = run_cli("plan", *flags, "--json", timeout=120, check_rc=0)
        assert proc.lines[0]["plan"]["world"] == ranks, (launcher, flags)
