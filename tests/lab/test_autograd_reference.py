"""`--reference autograd`: torch's own modules, autograd and torch.optim, sharing only the initial
weights and the data with partui. It agrees with the hand reference on a correct run, holds a matrix
of plans, and catches a wrong RMSNorm weight grad that the hand reference (which runs the same
wrong kernel as the plans) passes."""
import io
from contextlib import contextmanager

import pytest
import torch

from conftest import check_plan, run_cli
from kernels.check import Reference
from planning.config import make_config
from kernels.engine import Engine
from kernels.ep.deepseek_layer import DeepSeekMoE
from kernels.ep.layer import MoE
from kernels.layers.norm import RMSNorm
from planning.mesh import Plan
from kernels.torch_reference import TorchReference
from partui.world.checker import Checker
from partui.world.plans import build_plan
from partui.world.results import step_line
from partui.world.snapshot import step_item
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


def test_bf16_is_refused_before_launch():
    proc = run_cli("run", "--dtype", "bf16", "--check", "--reference", "autograd", timeout=60)
    assert proc.returncode == 2 and "runs fp32" in proc.stderr and "--reference" in proc.stderr
    assert "bf16 rounding is not the plan's" in proc.stderr


def _wrong_backward_weight(scale: float):
    """RMSNorm's weight grad times `scale`: an injected math error in a kernel every plan shares."""
    def backward_weight(self, ctx):
        d = ctx.dy.shape[-1]
        self.weight.accumulate((ctx.dy * ctx.xhat).reshape(-1, d).sum(0) * scale)
        ctx.xhat = ctx.dy = None
    return backward_weight


def _gate_grad_off(family):
    """The family's router grad (dlogits), off by 1%: an injected error in the hand MoE."""
    right = family.gate_backward
    return lambda self, r, dw: right(self, r, dw) * 1.01


INJECTED = {"rmsnorm weight grad": lambda: (RMSNorm, "backward_weight", _wrong_backward_weight(1.01)),
            "rmsnorm weight grad 1e-4": lambda: (RMSNorm, "backward_weight",
                                                 _wrong_backward_weight(1 + 1e-4)),
            "rmsnorm weight grad 1e-3": lambda: (RMSNorm, "backward_weight",
                                                 _wrong_backward_weight(1 + 1e-3)),
            "gshard gate grad": lambda: (MoE, "gate_backward", _gate_grad_off(MoE)),
            "deepseek gate grad": lambda: (DeepSeekMoE, "gate_backward",
                                           _gate_grad_off(DeepSeekMoE))}


@contextmanager
def injected(error: str | None):
    """The named error patched into its class for the block (this process and ranks forked in it)."""
    if error is None:
        yield
        return
    cls, attr, wrong = INJECTED[error]()
    right = cls.__dict__[attr]
    setattr(cls, attr, wrong)
    try:
        yield
    finally:
        setattr(cls, attr, right)


def _rank_items(rank, size, plan, cfg, steps, error):
    with injected(error):
        eng = Engine(plan, cfg, rank=rank)
        buf = io.BytesIO()
        torch.save([step_item(eng, check=True) for _ in range(steps)], buf)
    return buf.getvalue()


def _checked(reference: str, error: str | None, world: int, model: str = "tiny", steps: int = 2,
             **fields) -> list[dict]:
    plan, cfg = build_plan("custom", model, {"layers": 2}, **fields)
    per_rank = [torch.load(io.BytesIO(b), weights_only=False)
                for b in run_world(world, _rank_items, plan, cfg, steps, error, timeout_s=200)]
    with injected(error):        # the hand reference runs the same (wrong) kernel as the plan
        checker, lines = Checker(plan, cfg, reference=reference), []
        for i in range(steps):
            items = [r[i] for r in per_rank]
            line = step_line(items)
            checker.step(items, line)
            lines.append(line)
    return lines


@pytest.mark.parametrize("error, world, model, fields, where", [
    ("rmsnorm weight grad", 4, "tiny", dict(dp=2, tp=2), "norm.weight"),
    ("gshard gate grad", 2, "tiny", dict(dp=2, ep=2, experts=4), "moe.router.weight"),
    ("deepseek gate grad", 2, "deepseek-tiny", dict(dp=2, ep=2, seq_aux_alpha=0.1),
     "moe.router.weight"),
])
def test_an_injected_math_error_passes_the_hand_reference_and_fails_autograd(error, world, model,
                                                                            fields, where):
    hand = _checked("hand", error, world, model, **fields)
    assert not any("check" in ln for ln in hand), hand           # the shared kernel hides it
    caught = _checked("autograd", error, world, model, **fields)
    assert all("check" in ln and where in ln["check"] for ln in caught), caught
    assert not any("check" in ln for ln in _checked("autograd", None, world, model, **fields))


@pytest.mark.parametrize("error", ["rmsnorm weight grad 1e-4", "rmsnorm weight grad 1e-3"])
def test_a_small_relative_error_in_one_tensor_fails_autograd_at_step_0(error):
    """A 1e-4 relative error in the norms' weight grads is ~1e-7 absolute here, far under the
    absolute bound: the per-tensor relative bound (checker.GRAD_RTOL) catches it at the first step,
    while the honest run of the same plan passes."""
    caught = _checked("autograd", error, 2, steps=1, dp=2)
    assert "grad relative error" in caught[0].get("check", ""), caught
    assert "norm.weight" in caught[0]["check"]
    assert caught[0]["max_abs_grad_err"] < 2e-5              # the absolute bound alone passed it
    honest = _checked("autograd", None, 2, steps=1, dp=2)
    assert "check" not in honest[0] and honest[0]["max_rel_grad_err"] < 1e-5, honest
