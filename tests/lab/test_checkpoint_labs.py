"""Labs of the known silent checkpoint failures (issue 34, item 6). Each injects its bug
(kernels/checkpoint/faults.py) and shows the check that catches it fail, beside the same check
passing on the honest checkpoint:

    the truth   a world W steps once, saves, steps again: loss L and params P after it
    the check   whatever resumes the checkpoint takes that next step and must land on L and P
                (the single-process model from dcp_to_torch_save, or a world under another plan)
"""
import math

import pytest

from kernels.check import Reference
from kernels.checkpoint.reference import load_model, load_optimizer
from kernels.comm import dcp
from partui.world.launch import RankError
from planning.config import make_config, param_shapes
from planning.mesh import Plan
from tests.lab.checkpoint_helpers import whole_state, world

LOSS_ATOL, PARAM_ATOL = 2e-5, 1e-6     # --check's fp32 bounds (partui/world/checker.py)


def truth(name: str, root, fault: str | None = None):
    """(honest checkpoint, faulty one or None, next loss, whole state after the next step)."""
    with world(name) as w:
        w.step(1)
        good = w.save(str(root / "good"))
        bad = w.save(str(root / "bad"), fault=fault) if fault else None
        loss = w.step(1)[0]["loss"]
        after = whole_state(w.save(str(root / "after")), str(root))
    return good, bad, loss, after


def single_process_next_step(ckpt: str, root) -> tuple[float, dict]:
    """The one-process model and optimizer from the converted checkpoint, one step."""
    sd = whole_state(ckpt, str(root))
    ref = Reference(Plan(), make_config("tiny"))
    load_model(ref.model.layers, ref.params, sd)
    load_optimizer(ref.optimizer, ref.params, sd)
    ref.step_count = int(sd["train.step"])
    loss, _ = ref.step()
    return loss, {n: p.data for n, p in ref.params.items()}


def check(loss, params, want_loss, after) -> bool:
    """The next step lands where the uninterrupted run did (--check's bounds)."""
    worst = max((params[n] - after[f"model.{n}"]).abs().max().item() for n in params)
    return abs(loss - want_loss) <= LOSS_ATOL and worst <= PARAM_ATOL


@pytest.mark.timeout(300)
def test_tp_chunks_reordered_are_caught(tmp_path):
    """Megatron's reordered linear_fc1 chunks: tp 2 saves each rank's SwiGLU / QKV rows at the
    other rank's place; the single-process model resumed from it misses the next loss."""
    good, bad, loss, after = truth("tp2sp", tmp_path, "swap_tp_chunks")
    assert check(*single_process_next_step(good, tmp_path), loss, after)
    bad_loss, bad_params = single_process_next_step(bad, tmp_path)
    assert not check(bad_loss, bad_params, loss, after)
    assert abs(bad_loss - loss) > 100 * LOSS_ATOL, "a loud miss, as Megatron's loss jump was"


@pytest.mark.timeout(300)
def test_moments_on_the_wrong_parameter_are_caught(tmp_path):
    """ZeRO-2's m and v of wk saved under wv's name: the next loss is still right (it is computed
    before the update), the params after the update are not."""
    good, bad, loss, after = truth("zero2", tmp_path, "swap_moments")
    assert check(*single_process_next_step(good, tmp_path), loss, after)
    bad_loss, bad_params = single_process_next_step(bad, tmp_path)
    assert abs(bad_loss - loss) <= LOSS_ATOL
    assert not check(bad_loss, bad_params, loss, after)


@pytest.mark.timeout(300)
def test_a_dropped_data_position_under_a_dp_change_is_caught(tmp_path):
    """dp 2 -> dp 1 that forgets where the data was: the next step reads step 0's batch again."""
    good, _, loss, _ = truth("dp2", tmp_path)
    with world("zero1") as w:            # another dp layout: ZeRO-1 over 2 ranks
        w.load(good)
        honest = w.step(1)[0]["loss"]
        w.load(good, fault="drop_data_position")
        dropped = w.step(1)[0]
    assert abs(honest - loss) <= LOSS_ATOL
    assert dropped["step"] == 0 and abs(dropped["loss"] - loss) > LOSS_ATOL


@pytest.mark.timeout(300)
def test_dualpipe_copies_written_twice_or_summed_are_caught(tmp_path):
    """DualPipe holds every stage on two ranks. Written once: the chunks in DCP's index cover the
    model and optimizer exactly once. Written twice: DCP's global plan refuses it. Loaded by
    adding the two copies: the next loss misses."""
    good, _, loss, _ = truth("dualpipe", tmp_path)
    index = dcp.tensor_index(good)
    saved = sum(math.prod(size) for fqn, e in index.items() if fqn.startswith(("model.", "optim."))
                for _, size in e["chunks"])
    numel = sum(math.prod(s) for s in param_shapes(make_config("tiny")).values())
    assert saved == 3 * numel                        # param, m, v: each element once
    with world("dualpipe") as w:
        w.step(1)
        # DCP's global plan refuses a box listed twice (today: "item.index.fqn not in md")
        with pytest.raises(RankError, match="CheckpointException"):
            w.save(str(tmp_path / "twice"), fault="write_twice")
    with world("dualpipe") as w:
        w.load(good)
        assert abs(w.step(1)[0]["loss"] - loss) <= LOSS_ATOL
        w.load(good, fault="sum_mirror")
        assert abs(w.step(1)[0]["loss"] - loss) > LOSS_ATOL
