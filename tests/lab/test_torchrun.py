"""`torchrun --standalone --nproc-per-node 4 -m partui run ...` equals `partui run` with the same
plan: the same step losses, and each rank the same coordinates, role and memory ledger."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli

pytestmark = pytest.mark.timeout(400)
PLAN = ("--dp", "2", "--pp", "2", "--microbatches", "2", "--layers", "2", "--steps", "3", "--json")


def test_torchrun_world_4_equals_partui_run():
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun not installed")
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "4", "-m", "partui",
                           "run", *PLAN], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    joined = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    spawned = run_cli("run", *PLAN, timeout=300, check_rc=0).lines
    summary, ref = joined[-1]["summary"], spawned[-1]["summary"]
    assert summary["backend"] == "gloo" and summary["world"] == ref["world"] == 4
    assert [ln["step"] for ln in joined[:-1]] == [0, 1, 2]
    for a, b in zip(joined[:-1], spawned[:-1]):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    assert summary["ranks"] == ref["ranks"]          # rank, label, role, ledger: the same world
