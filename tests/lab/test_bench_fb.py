"""`partui bench fb`: on / off rows per schedule with the report's pair figures, the same model on and off
(equal losses), and bad input refused before any world starts. Times are reported, not asserted."""
import pytest

from conftest import run_cli
from partui.bench.fb import rows_of


@pytest.mark.timeout(300)
def test_bench_fb_rows_on_and_off():
    proc = run_cli("bench", "fb", "--schedules", "1f1b,dualpipev", "--model", "tiny", "--layers", 4, "--seq", 16,
                   "--steps", 1, "--warmup", 0, "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.lines[-1]
    assert out["link"]["intra"] == {"alpha_us": 100.0, "gbps": 0.035}
    rows = out["rows"]
    assert [(r["schedule"], r["fb_overlap"], r["world"]) for r in rows] == [
        ("1f1b", "on", 4), ("1f1b", "off", 4), ("dualpipev", "on", 4), ("dualpipev", "off", 4)]
    for on, off in (rows[:2], rows[2:]):
        assert on["loss"] == pytest.approx(off["loss"], abs=1e-5)       # one model, one step: equal losses
        assert off["vs_off"] == 1
    for r in rows:
        assert r["pair_a2a_ms"] > 0 and 0 <= r["exposed_ms"] <= r["pair_a2a_ms"] and r["step_ms"] > 0
        assert r["hidden_pct"] == pytest.approx(100 * (1 - r["exposed_ms"] / r["pair_a2a_ms"]))
        assert r["own_device_ms"] > 0 and 0 < r["core_share_pct"] <= 100   # tests/lab/test_own_device.py
    assert "cores" in out["cores"] and "of their busy time" in out["cores"]


def test_rows_by_hand():
    """Two ranks, two steps, one variant pair: step_ms the median over steps of the slowest rank's (on:
    max(10, 12), max(30, 14) -> 21; off: 25, 20 -> 22.5); the pair figures averaged per rank per step (on:
    a2a (8 + 12 + 12 + 8) / 4 = 10, exposed 4: hidden 100 * (1 - 4 / 10) = 60)."""
    variants = [("1f1b", True, {}, {}), ("1f1b", False, {}, {})]
    per_rank = [[[(10, 8, 2, 1, 5.0), (30, 12, 6, 1, 4.0)], [(20, 20, 20, 1, 5.0), (20, 20, 20, 1, 4.0)]],
                [[(12, 12, 6, 3, 5.0), (14, 8, 2, 3, 4.0)], [(25, 20, 20, 3, 5.0), (15, 20, 20, 3, 4.0)]]]
    on, off = rows_of(variants, per_rank, world=2, steps=2)
    assert (on["step_ms"], on["pair_a2a_ms"], on["exposed_ms"], on["hidden_pct"]) == (21, 10, 4, 60)
    assert (on["expert_ms"], on["loss"], off["hidden_pct"], off["step_ms"]) == (2, 4.0, 0, 22.5)
    assert on["vs_off"] == pytest.approx(21 / 22.5)


@pytest.mark.parametrize("args, needle", [
    (["--schedules", "1f1b,nope"], "pick from"),
    (["--steps", "0"], "--steps: 0 must be >= 1"),
    (["--link", "alpha_us=1"], "gbps"),
])
def test_bench_fb_bad_input_exits_2(args, needle):
    proc = run_cli("bench", "fb", *args, timeout=60)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
