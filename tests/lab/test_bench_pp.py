"""`partui bench pp`: the torch peer trains the very same model (equal first losses), every row carries its
ratios, and bad input exits 2 before any world starts. Times are reported, not asserted."""
import pytest

from conftest import run_cli


@pytest.mark.timeout(300)
def test_bench_pp_peer_is_the_same_model():
    proc = run_cli("bench", "pp", "--worlds", 2, "--model", "tiny", "--layers", 4, "--microbatches", 4,
                   "--schedules", "1f1b,dualpipev", "--rounds", 1, "--warmup", 0, "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = proc.lines[-1]["rows"]
    assert [(r["world"], r["ours"], r["torch"]) for r in rows] == [
        (2, "1f1b", "Schedule1F1B"), (2, "dualpipev", "ScheduleDualPipeV")]
    for r in rows:
        assert r["loss_ours"] == pytest.approx(r["loss_torch"], abs=1e-4)
        assert all(r[k] > 0 for k in ("ours_ms", "torch_ms", "ours/torch", "min ratio", "cpu_all ratio"))


@pytest.mark.parametrize("args, needle", [
    (["--worlds", "1"], "need 2 ranks or more"),
    (["--schedules", "1f1b,nope"], "pick from"),
    (["--worlds", "4", "--layers", "4"], "multiple of 8"),
])
def test_bench_pp_bad_input_exits_2(args, needle):
    proc = run_cli("bench", "pp", *args, timeout=60)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
