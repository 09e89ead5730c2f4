"""`partui plan --resume DIR`: the reshard on paper, held to sizes known by hand: a one-rank plan
reads every saved element once; every new rank's pieces of a tensor tile the box it holds; the
pieces name the ranks whose files hold them."""
import math

import pytest

from conftest import run_here
from partui.checkpoints.reshard_map import reshard_map
from planning.config import make_config, param_shapes
from planning.mesh import Plan
from tests.lab.checkpoint_helpers import world


@pytest.fixture(scope="module")
def zero3(tmp_path_factory):
    with world("zero3") as w:
        w.step(1)
        return w.save(str(tmp_path_factory.mktemp("z3") / "ckpt"))


def test_one_rank_reads_the_whole_model_and_optimizer_once(zero3):
    cfg = make_config("tiny")
    doc = reshard_map(zero3, Plan(dp=1).resolved(), cfg)
    numel = sum(math.prod(s) for s in param_shapes(cfg).values())
    assert doc["read_bytes"] == {0: numel * 4 * 3}        # fp32 param, m and v
    assert {r["from_rank"] for r in doc["rows"]} == {0, 1}  # ZeRO-3: both ranks wrote a share


def test_each_new_rank_gets_exactly_its_tp_shard(zero3):
    cfg = make_config("tiny")
    doc = reshard_map(zero3, Plan(tp=2).resolved(), cfg)
    got: dict = {}
    for r in doc["rows"]:
        got[(r["tensor"], r["to_rank"])] = got.get((r["tensor"], r["to_rank"]), 0) + r["bytes"]
    wq = param_shapes(cfg)["layers.0.attn.wq.weight"]          # column-parallel: rows split
    for rank in (0, 1):
        assert got[("model.layers.0.attn.wq.weight", rank)] == math.prod(wq) // 2 * 4
        assert got[("model.norm.weight", rank)] == cfg.dim * 4   # replicated: whole on each
        rows = [r for r in doc["rows"] if r["tensor"] == "model.layers.0.attn.wq.weight"
                and r["to_rank"] == rank]
        assert all(rank * wq[0] // 2 <= r["offsets"][0] and
                   r["offsets"][0] + r["sizes"][0] <= (rank + 1) * wq[0] // 2 for r in rows)


def test_the_cli_prints_the_map_and_refuses_a_bad_folder(zero3, tmp_path):
    proc = run_here("plan", "--tp", 2, "--resume", zero3, check_rc=0)
    assert "saved under dp 2" in proc.stdout and "bytes each new rank reads" in proc.stdout
    proc = run_here("plan", "--tp", 2, "--resume", tmp_path)
    assert proc.returncode == 2 and "not a checkpoint" in proc.stderr
