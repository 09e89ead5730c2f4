"""`--dtype bf16` from the command line: bf16 params and grads, fp32 master weights and Adam,
checked against the single-process mixed-precision reference (bf16 tolerance 3e-2 absolute,
set in partui/checker.py: one bf16 ulp at loss ~5 is 0.03)."""
from conftest import check_plan


def test_zero2_bf16_matches_the_mixed_reference():
    s = check_plan("--dp", 2, "--zero", 2, "--dtype", "bf16", "--layers", 2, steps=2)
    assert s["max_abs_grad_err"] < 3e-2
    led = s["ranks"][0]["ledger"]
    assert led["params"] < led["optimizer"]  # 2-byte params beside 4-byte m, v (and master)
