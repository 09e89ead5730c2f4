"""The memory ledger equals the ZeRO paper's formulas, byte for byte, on real 2- and 4-rank runs."""
import pytest

from conftest import run_here
from planning.config import make_config
from kernels.dp.sync import ledger_formula

PSI = make_config("tiny").n_params()    # 217664, divisible by 2 and 4: no padding


def paper_bytes(stage, psi, n, k):
    """ZeRO paper, Figure 1, with p = g = 4 bytes (fp32) and K bytes of optimizer state."""
    return {0: (4 + 4 + k) * psi, 1: (4 + 4) * psi + k * psi // n,
            2: 4 * psi + (4 + k) * psi // n, 3: (4 + 4 + k) * psi // n}[stage]


def test_formula_function():
    for stage in range(4):
        f = ledger_formula(stage, PSI, PSI, 4, 4, 4, 8)
        assert sum(f.values()) == paper_bytes(stage, PSI, 4, 8)
    assert ledger_formula(1, 10, 12, 4, 2, 2, 12) == {"params": 24, "grads": 24, "optimizer": 36}
    assert sum(ledger_formula(2, 8, 8, 4, 2, 2, 12).values()) == 2 * 8 + 14 * 8 // 4


def _ledgers(*args):
    proc = run_here("run", *args, "--steps", 1, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [r["ledger"] for r in proc.lines[-1]["summary"]["ranks"]]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", [2, 4])
def test_ledger_bytes_equal_the_paper(n):
    for stage in range(4):
        for led in _ledgers("--dp", n, "--zero", stage):
            assert led["psi"] == PSI and led["n"] == n
            total = led["params"] + led["grads"] + led["optimizer"]
            assert total == paper_bytes(stage, PSI, n, 8), (stage, led)
            assert led["matches_formula"]
            if stage == 3:
                assert 0 < led["gathered_peak"] < 4 * PSI   # some layers, never the model


@pytest.mark.timeout(400)
def test_zero3_state_shrinks_as_n_grows_and_sgd_has_no_state():
    per_n = {n: _ledgers("--dp", n, "--zero", 3, "--optim", "sgd")[0] for n in (2, 4)}
    assert per_n[4]["total"] * 2 == per_n[2]["total"] == (4 + 4) * PSI // 2
    assert per_n[4]["optimizer"] == 0
