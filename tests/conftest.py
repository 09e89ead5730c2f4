"""Shared helpers: run the CLI in a subprocess with a deadline, so a deadlock fails, not hangs, or
in this process (`run_here`: the plan checks, where python's start and torch's import would be
most of the time); and the `gloo_world` fixture (tests/worlds.py) for worlds of forked ranks
inside a test.

This directory is on sys.path (pytest's prepend import mode inserts a rootdir conftest's
directory), so tests in tests/kernels, tests/lab and tests/app import `from conftest import ...`
and `from worlds import run_world`."""
import contextlib
import io
import json
import os
import subprocess
import sys
import types

import pytest

from partui.cli import main
from worlds import run_world

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, timeout=180, check_rc=None):
    """`python -m partui ARGS`; returns CompletedProcess with .lines = parsed JSON lines."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "partui", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)
    proc.lines = json_lines(proc.stdout)
    return checked(proc, check_rc)


def json_lines(text: str) -> list:
    out = []
    for ln in text.splitlines():
        if ln.startswith("{"):
            try:
                out.append(json.loads(ln))
            except json.JSONDecodeError:
                pass
    return out


def run_here(*args, check_rc=None):
    """`partui ARGS` through partui.cli.main in this process, as run_cli returns it (returncode,
    stdout, stderr, lines). The worlds it launches fork from this process's fork server, which
    stays warm across tests: ~0.4 s a small plan check instead of ~6 s for a fresh interpreter.
    Deadlines: a silent rank trips the world's own (`--timeout`, 120 s a command), and the test's
    timeout mark (pytest-timeout, 300 s unless the test says) bounds the whole. For what only a
    fresh process shows (exit on a signal, a closed pipe, torchrun's environment) use run_cli."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:                 # argparse's own refusals
            rc = e.code
    proc = types.SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue(),
                                 lines=json_lines(out.getvalue()))
    return checked(proc, check_rc)


def checked(proc, check_rc):
    """proc, after asserting its exit code where one is asked (run_cli's and run_here's)."""
    if check_rc is not None:
        assert proc.returncode == check_rc, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def check_plan(*args, steps=3):
    """`partui run ARGS --check --json` (in this process): assert it passes; returns the summary."""
    proc = run_here("run", *args, "--steps", steps, "--check", "--json")
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary = proc.lines[-1]["summary"]
    assert summary["check"] == "passed"
    assert summary["steps"] == steps
    return summary


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def cli_here():
    """run_here: the command in this process, the fork server kept warm between tests."""
    return run_here


@pytest.fixture
def gloo_world():
    """run_world(size, fn, *args, timeout_s=...) from tests/worlds.py: fn on `size` forked
    gloo ranks, results in rank order, bounded by a deadline."""
    return run_world


@pytest.fixture(autouse=True)
def app_traces_in_tmp(request, monkeypatch):
    """The app's automatic trace names (traces/app-TIME.json) go to the test's tmp folder, never
    the checkout, whether or not the test gets to remove them."""
    if request.path.parent.name == "app":
        import partui.world.world_trace
        monkeypatch.setattr(partui.world.world_trace, "TRACE_DIR", str(request.getfixturevalue("tmp_path")))
