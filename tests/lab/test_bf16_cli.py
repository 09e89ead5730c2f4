"""`--dtype bf16` from the command line: bf16 params and grads, fp32 master weights and Adam,
checked against the single-process mixed-precision reference (each grad within a multiple of bf16's
own rounding of it, partui/world/checker.py BF16_NOISE_RATIO)."""
from conftest import check_plan

from partui.world.checker import BF16_NOISE_RATIO


def test_zero2_bf16_matches_the_mixed_reference():
    s = check_plan("--dp", 2, "--zero", 2, "--dtype", "bf16", "--layers", 2, steps=2)
    assert s["max_abs_grad_err"] < 3e-2
    assert 0 < s["grad_noise_ratio"] <= BF16_NOISE_RATIO
    led = s["ranks"][0]["ledger"]
    assert led["params"] < led["optimizer"]  # 2-byte params beside 4-byte m, v (and master)
