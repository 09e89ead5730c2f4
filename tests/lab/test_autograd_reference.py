"""`--reference autograd`: torch's own modules, autograd and torch.optim, sharing only the initial
weights and the data with partui. It agrees with the hand reference on a correct run, holds a matrix
of plans, and catches a wrong RMSNorm weight grad that the hand reference (which runs the same
wrong kernel as the plans) passes."""
import io

import pytest
import torch

from conftest import check_plan, run_cli
from kernels.check import Reference
from kernels.config import make_config
from kernels.engine import Engine
from kernels.layers.norm import RMSNorm
from kernels.mesh import Plan
from kernels.torch_reference import TorchReference
from partui.checker import Checker
from partui.plans import build_plan
from partui.results import step_line
from partui.snapshot import step_item
from worlds import run_world


@pytest.mark.parametrize("optim", ["adamw", "sgd"])
def test_torch_modules_agree_with_the_hand_reference(optim):
    plan, cfg = Plan(), make_config("tiny", layers=2)
    hand, torch_ref = Reference(plan, cfg, optim=optim), TorchReference(plan, cfg, optim=optim)
    for _ in range(3):
        (loss_h, grads_h), (loss_t, grads_t) = hand.forward_backward(), torch_ref.forward_backward()
        assert loss_t == pytest.approx(loss_h, abs=2e-6)
        for name, g in grads_h.items():
            torch.testing.assert_close(grads_t[name], g, atol=2e-6, rtol=1e-5)
        params_h, params_t = hand.update(grads_h), torch_ref.update(grads_h)
        for name, p in params_h.items():
            torch.testing.assert_close(params_t[name], p, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("args", [
    ["--dp", 2, "--zero", 1], ["--tp", 2, "--sp"], ["--pp", 2, "--schedule", "zb1p", "--microbatches", 2],
    ["--cp", 2, "--cp-mode", "zigzag"], ["--dp", 2, "--tp", 2, "--layers", 2],
])
def test_plans_hold_to_the_autograd_reference(args):
    check_plan(*args, "--reference", "autograd", steps=2)


def test_moe_and_bf16_are_refused_before_launch():
    for args, words in ((["--experts", "4"], "covers dense models so far"),
                        (["--dtype", "bf16"], "runs fp32 so far")):
        proc = run_cli("run", *args, "--check", "--reference", "autograd", timeout=60)
        assert proc.returncode == 2 and words in proc.stderr and "--reference" in proc.stderr


def _wrong_backward_weight(scale):
    """RMSNorm's weight grad, off by a factor: the injected math error."""
    def backward_weight(self, ctx):
        d = ctx.dy.shape[-1]
        self.weight.accumulate((ctx.dy * ctx.xhat).reshape(-1, d).sum(0) * scale)
        ctx.xhat = ctx.dy = None
    return backward_weight


def _rank_items(rank, size, plan, cfg, steps, scale):
    if scale != 1.0:
        RMSNorm.backward_weight = _wrong_backward_weight(scale)   # this rank process only
    eng = Engine(plan, cfg, rank=rank)
    buf = io.BytesIO()
    torch.save([step_item(eng, check=True) for _ in range(steps)], buf)
    return buf.getvalue()


def _checked(reference: str, scale: float, steps: int = 2) -> list[dict]:
    plan, cfg = build_plan("custom", "tiny", {"layers": 2}, dp=2, tp=2)
    per_rank = [torch.load(io.BytesIO(b), weights_only=False)
                for b in run_world(4, _rank_items, plan, cfg, steps, scale, timeout_s=200)]
    original = RMSNorm.backward_weight
    try:
        if scale != 1.0:        # the hand reference runs the same (wrong) kernel as the plan
            RMSNorm.backward_weight = _wrong_backward_weight(scale)
        checker, lines = Checker(plan, cfg, reference=reference), []
        for i in range(steps):
            items = [r[i] for r in per_rank]
            line = step_line(items)
            checker.step(items, line)
            lines.append(line)
    finally:
        RMSNorm.backward_weight = original
    return lines


def test_a_wrong_rmsnorm_weight_grad_passes_the_hand_reference_and_fails_autograd():
    hand = _checked("hand", 1.01)
    assert not any("check" in ln for ln in hand), hand           # the shared kernel hides it
    caught = _checked("autograd", 1.01)
    assert all("check" in ln and "norm.weight" in ln["check"] for ln in caught), caught
    assert not any("check" in ln for ln in _checked("autograd", 1.0))
