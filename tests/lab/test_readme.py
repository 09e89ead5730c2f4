"""The README's test command is exactly what .ci/run runs."""
import os

from conftest import ROOT


def test_ci_runs_the_readme_test_command():
    readme = open(os.path.join(ROOT, "README.md")).read()
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    cmd = 'pip install -q -e ".[test]" && python -m pytest -q'
    assert cmd in readme.split("\n## ")[0], "README must open with the test command"
    assert cmd in ci
    assert "torch==2.13.0" in ci and "venv" in ci
