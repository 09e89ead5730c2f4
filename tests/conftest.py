"""Shared helpers: run the CLI in a subprocess with a deadline, so a deadlock fails, not hangs;
and the `gloo_world` fixture (tests/worlds.py) for worlds of forked ranks inside a test.

This directory is on sys.path (pytest's prepend import mode inserts a rootdir conftest's
directory), so tests in tests/kernels, tests/lab and tests/app import `from conftest import ...`
and `from worlds import run_world`."""
import json
import os
import subprocess
import sys

import pytest

from worlds import run_world

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args, timeout=180, check_rc=None):
    """`python -m partui ARGS`; returns CompletedProcess with .lines = parsed JSON lines."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "partui", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)
    proc.lines = []
    for ln in proc.stdout.splitlines():
        if ln.startswith("{"):
            try:
                proc.lines.append(json.loads(ln))
            except json.JSONDecodeError:
                pass
    if check_rc is not None:
        assert proc.returncode == check_rc, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def check_plan(*args, steps=3, timeout=240):
    """`partui run ARGS --check --json`: assert it passes; returns the summary."""
    proc = run_cli("run", *args, "--steps", steps, "--check", "--json", timeout=timeout)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary = proc.lines[-1]["summary"]
    assert summary["check"] == "passed"
    assert summary["steps"] == steps
    return summary


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def gloo_world():
    """run_world(size, fn, *args, timeout_s=...) from tests/worlds.py: fn on `size` forked
    gloo ranks, results in rank order, bounded by a deadline."""
    return run_world
