"""A fault under torchrun (gloo, torch's flight recorder on): a hang ends with a verdict in well
under gloo's timeout, every rank exits, nothing is left running, and partui doctor on torch's own
dumps gives the verdict partui's dump gives."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT

pytestmark = pytest.mark.timeout(300)


def torchrun():
    path = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(path):
        pytest.skip("torchrun not installed")
    return path


def doctor(*args):
    proc = subprocess.run([sys.executable, "-m", "partui", "doctor", *args, "--json"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    return json.loads(proc.stdout)["headline"]


def test_group_order_under_torchrun_is_named_in_seconds_with_the_same_verdict(tmp_path):
    prefix, ours = str(tmp_path / "torch" / "rank_"), str(tmp_path / "flight.json")
    os.makedirs(os.path.dirname(prefix))
    t0 = time.monotonic()
    # --timeout 300: gloo's own timeout is never what ends the run
    proc = subprocess.run([torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "partui",
                           "run", "--dp", "2", "--layers", "2", "--steps", "3", "--timeout", "300",
                           "--fault", "group-order@1:1", "--flight-dump", ours],
                          capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1", TORCH_FR_DUMP_TEMP_FILE=prefix))
    wall = time.monotonic() - t0
    assert proc.returncode != 0
    said = proc.stderr
    assert "the world stopped making progress under torchrun: rank" in said, said[-3000:]
    blocked = float(said.split("blocked ")[1].split(" s")[0])
    assert 5.0 <= blocked < 10.0                      # named within 10 s of the hang
    assert wall < 120, wall                           # far inside gloo's 300 s
    left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert ours not in left, "a rank outlived the job"
    mine = doctor(ours)
    assert mine["kind"] == "deadlock" and 1 in mine["culprits"], mine
    theirs = doctor(prefix)                            # torch's dumps alone
    merged = doctor(prefix, "--with", ours)
    for h in (theirs, merged):
        assert (h["kind"], h["group"], h["seq"], h["culprits"]) == (
            mine["kind"], mine["group"], mine["seq"], mine["culprits"]), (h, mine)
