"""Same plan, bit for bit: N steps straight equal K steps, a save, a new world, a resume and N - K
steps (losses, and every parameter, optimizer state, buffer and step through dcp_to_torch_save,
torch.equal); a killed save leaves the last checkpoint; a rank killed after a save resumes exactly;
the converted state dict loads into the single-process model."""
import os
import signal

import pytest
import torch

from kernels.check import Reference
from kernels.checkpoint.reference import load_model, load_optimizer
from partui.checkpoints.checkpoint import saved_steps
from partui.world.launch import RankError, WorldTimeout
from planning.config import make_config
from planning.mesh import Plan
from tests.lab.checkpoint_helpers import differences, whole_state, world

N, K = 3, 1
SAME_PLAN = ["dp2", "zero1", "zero2", "zero3", "tp2sp", "pp1f1b", "interleaved", "dualpipe",
             "dualpipev", "cp2", "ep2", "ds_ep2", "mesh3d"]


def straight_and_resumed(name: str, tmp_path, kill_after_save: bool = False):
    with world(name) as w:
        straight = [ln["loss"] for ln in w.step(N)]
        a = w.save(str(tmp_path / "straight"))
    w1 = world(name)
    try:
        w1.step(K)
        mid = w1.save(str(tmp_path / "mid"))
        if kill_after_save:        # the first world dies after its save: nothing of it is needed
            os.kill(w1.pids()[-1], signal.SIGKILL)
            with pytest.raises((RankError, WorldTimeout)):
                w1.step(1)
    finally:
        w1.close()
    with world(name) as w2:
        assert w2.load(mid) == K
        resumed = [ln["loss"] for ln in w2.step(N - K)]
        steps = [ln["step"] for ln in w2.history]
        b = w2.save(str(tmp_path / "resumed"))
    return straight, resumed, steps, a, b


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", SAME_PLAN)
def test_same_plan_resume_is_bit_for_bit(name, tmp_path):
    straight, resumed, steps, a, b = straight_and_resumed(name, tmp_path)
    assert steps == list(range(K, N)), "steps are numbered on from the checkpoint's"
    assert resumed == straight[K:]
    sa, sb = whole_state(a, str(tmp_path), keep_rng=True), whole_state(b, str(tmp_path), True)
    assert differences(sa, sb) == []
    assert int(sa["train.step"]) == N
    assert any(k.endswith(".exp_avg_sq") for k in sa)


@pytest.mark.timeout(300)
def test_bf16_masters_resume_bit_for_bit(tmp_path):
    straight, resumed, _, a, b = straight_and_resumed("zero2_bf16", tmp_path)
    assert resumed == straight[K:]
    sa, sb = whole_state(a, str(tmp_path)), whole_state(b, str(tmp_path))
    assert differences(sa, sb) == []
    masters = [k for k in sa if k.endswith(".master")]
    assert masters and sa[masters[0]].dtype == torch.float32
    assert sa["model.embed.weight"].dtype == torch.bfloat16


@pytest.mark.timeout(300)
def test_a_rank_killed_after_its_save_resumes_exactly(tmp_path):
    straight, resumed, _, a, b = straight_and_resumed("zero2", tmp_path, kill_after_save=True)
    assert resumed == straight[K:]
    assert differences(whole_state(a, str(tmp_path)), whole_state(b, str(tmp_path))) == []


@pytest.mark.timeout(300)
def test_a_save_killed_half_way_leaves_the_last_checkpoint(tmp_path):
    root = str(tmp_path / "ckpt")
    with world("zero1") as w:
        w.step(1)
        good = w.save(root)
        w.step(1)
        with pytest.raises((RankError, WorldTimeout)):
            w.save(root, kill_rank=1)        # rank 1 writes its file, then SIGKILL: no commit
    assert saved_steps(root) == [good]
    assert not [n for n in os.listdir(root) if n.startswith(".partial")], "the partial is removed"
    with world("zero3") as w:                # still loadable, under another plan too
        assert w.load(root) == 1


@pytest.mark.timeout(300)
def test_keep_drops_the_oldest(tmp_path):
    root = str(tmp_path / "ckpt")
    with world("dp2") as w:
        for _ in range(3):
            w.step(1)
            w.save(root, keep=2)
    assert [os.path.basename(p) for p in saved_steps(root)] == ["step-00000002", "step-00000003"]


@pytest.mark.timeout(300)
def test_the_converted_state_dict_loads_into_the_single_process_model(tmp_path):
    """dcp_to_torch_save's plain state dict -> the one-process reference; its next step equals
    the sharded world's next step (loss) and lands on the same params."""
    with world("tp2sp") as w:
        w.step(2)
        ckpt = w.save(str(tmp_path / "c"))
        nxt = w.step(1)[0]["loss"]
        after = w.save(str(tmp_path / "c"))
    sd = whole_state(ckpt, str(tmp_path))
    ref = Reference(Plan(), make_config("tiny"))
    load_model(ref.model.layers, ref.params, sd)
    load_optimizer(ref.optimizer, ref.params, sd)
    ref.step_count = int(sd["train.step"])
    loss, _ = ref.step()
    assert abs(loss - nxt) < 2e-5
    want = whole_state(after, str(tmp_path))
    worst = max((ref.params[n].data - want[f"model.{n}"]).abs().max().item() for n in ref.params)
    assert worst < 1e-6
