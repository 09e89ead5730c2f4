"""Each bad checkpoint is refused before any step: exit 2, one line naming the difference and a fix,
and nothing on disk changes. The bad checkpoints are made from one good one (dp 2, one step):
copied, then damaged one way each."""
import json
import os
import pickle
import shutil

import pytest

from conftest import run_here
from partui.checkpoints.checkpoint import MANIFEST
from tests.lab.checkpoint_helpers import world


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("good")
    with world("dp2") as w:
        w.step(1)
        return w.save(str(root / "ckpt"))


def damaged(good: str, tmp: str, how) -> str:
    bad = os.path.join(tmp, "bad")
    shutil.copytree(good, bad)
    how(bad)
    return bad


def rewrite_manifest(ckpt: str, **changes) -> None:
    path = os.path.join(ckpt, MANIFEST)
    with open(path) as f:
        man = json.load(f)
    man.update(changes)
    with open(path, "w") as f:
        json.dump(man, f)


def drop_tensor(ckpt: str, fqn: str = "optim.layers.0.attn.wq.weight.exp_avg") -> None:
    """DCP's index without one tensor (the manifest told the index's new size, so only the
    tensor check can see it)."""
    path = os.path.join(ckpt, ".metadata")
    with open(path, "rb") as f:
        md = pickle.load(f)
    del md.state_dict_metadata[fqn]
    with open(path, "wb") as f:
        pickle.dump(md, f)
    with open(os.path.join(ckpt, MANIFEST)) as f:
        files = json.load(f)["files"]
    rewrite_manifest(ckpt, files=dict(files, **{".metadata": os.path.getsize(path)}))


def truncate(ckpt: str) -> None:
    path = os.path.join(ckpt, "__0_0.distcp")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


CASES = {  # name: (damage or None, extra flags, words the one line holds)
    "bigger model": (None, ["--dim", "128"], "different model (dim 64 there, 128 here"),
    "other vocab": (None, ["--vocab", "128"], "--vocab 256"),
    "dtype": (None, ["--dtype", "bf16"], "resume with --dtype fp32"),
    "seed": (None, ["--seed", "3"], "resume with --seed 0"),
    "optimizer": (None, ["--optim", "sgd"], "resume with --optim adamw"),
    "plan the model cannot take": (None, ["--tp", "3"], "pick tp in 1, 2, 4"),
    "missing rank file": (lambda c: os.remove(os.path.join(c, "__1_0.distcp")), [],
                          "__1_0.distcp is missing"),
    "truncated file": (truncate, [], "(truncated or changed)"),
    "missing tensor": (drop_tensor, [], "no tensor optim.layers.0.attn.wq.weight.exp_avg"),
    "not a checkpoint": (lambda c: os.remove(os.path.join(c, MANIFEST)), [],
                         "a DCP folder without partui's manifest"),
    "damaged manifest": (lambda c: open(os.path.join(c, MANIFEST), "w").write("{"), [],
                         "partui.json cannot be read"),
}


def snapshot(folder: str) -> dict:
    return {os.path.join(d, n): os.path.getsize(os.path.join(d, n))
            for d, _, names in os.walk(folder) for n in names}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_checkpoint_is_refused_before_any_step(case, good, tmp_path):
    how, extra, words = CASES[case]
    ckpt = damaged(good, str(tmp_path), how) if how else good
    before, save_to = snapshot(ckpt), tmp_path / "out"
    proc = run_here("run", "--dp", 2, "--steps", 1, "--resume", ckpt, "--save", save_to, *extra)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines
    assert proc.stdout == ""                      # no step ran
    assert snapshot(ckpt) == before               # nothing overwritten
    assert not [n for n in os.listdir(save_to) if n.startswith("step-")] if save_to.exists() else True


@pytest.mark.timeout(120)
def test_an_empty_folder_and_no_folder_are_refused(tmp_path):
    for path, words in ((tmp_path, "not a checkpoint"), (tmp_path / "nope", "no such folder")):
        proc = run_here("run", "--dp", 2, "--resume", path)
        assert proc.returncode == 2 and words in proc.stderr and len(proc.stderr.splitlines()) == 1


@pytest.mark.timeout(120)
def test_checkpoint_flags_that_cannot_work_are_refused():
    for argv, words in ((["--save-every", "2"], "--save-every needs --save DIR"),
                        (["--keep", "2"], "--keep needs --save DIR"),
                        (["--save", "x", "--save-every", "-1"], "must be >= 1"),
                        (["--steps", "0", "--resume", "x"], "only with --resume DIR --save DIR2")):
        proc = run_here("run", "--dp", 2, *argv)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr


@pytest.mark.timeout(400)
def test_the_same_checkpoint_path_under_torchrun(tmp_path):
    """torchrun's ranks save through the same door (rank 0 commits); partui's own world resumes it
    under another plan and its next step passes --check."""
    import subprocess
    import sys
    from conftest import ROOT
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun not installed")
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "partui", "run",
                           "--dp", "2", "--zero", "3", "--steps", "2", "--save", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "step-00000002" / MANIFEST).exists()
    res = run_here("run", "--tp", 2, "--resume", tmp_path, "--steps", 1, "--check", "--json",
                   check_rc=0)
    assert res.lines[0]["step"] == 2 and res.lines[-1]["summary"]["check"] == "passed"
