"""A straggler set between steps (World.slow, the app's `slow`) in one running world: each rank's
live factor, its extra compute in the trace on that rank only, clear messages for bad input, and
the done-when of issue 27 in the same world, on dp 2 and on pp 2 x dp 2: `partui blame` on the
slowed steps names rank 1 first, and its slowdown is within 10% of the step-time ratio (slowed /
unslowed medians).

The same-world measurement is `partui bench blame`'s (partui/bench/blame.py says how it interleaves
slowed and unslowed steps in one world). It is a timing: it runs with PARTUI_QUIET=1 on a machine
with nothing else running, and skips where the unslowed steps alone already read as a straggler
past the tolerance (blame slowdown > 1.10 with nothing slowed: the noise could not be told from
the straggler), naming the figures. Blame's ideal step takes each stage's fastest rank, while the
step ratio's baseline is the unslowed steps, which carry that floor's own straggling: a miss of
10% is allowed only as far as the floor reaches: where blame's slowdown over the floor is within
10% (the bench's verdict "within the noise floor"). Measured on this 2-core machine, quiet, 36
plan runs of `partui bench blame`: 32 within 10% outright (dp 2: -4% to +13%, pp 2 x dp 2: -6%
to +10%), the other four (all dp 2) 10.6-13.4% off at floors 1.03-1.06; over the floor every run
was within -7% to +10%."""
import gzip
import json
import os

import pytest

from partui import World
from partui.bench.blame import (BLOCK, MODEL, ROUNDS, agreement, main as bench_blame, measure,
                                plan_fields, verdict, within_floor)

pytestmark = pytest.mark.timeout(600)

TOLERANCE = 0.10


def straggle_ranks(path: str) -> set:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return {e["pid"] for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name") == "straggle"}


def traced_step(w: World, path) -> str:
    w.trace_on()
    w.step(1)
    return w.trace_save(str(path))


def test_slow_between_steps_sets_each_ranks_factor(tmp_path):
    with World(timeout_s=180) as w:
        w.plan("custom", model="tiny", dp=2)
        with pytest.raises(RuntimeError, match="launch first"):
            w.slow(rank=1, factor=1.5)
        w.launch()
        assert w.slow_text() == "no straggler"
        assert w.slow(rank=1, factor=1.5) == [1.0, 1.5]
        assert w.slow_text() == "rank 1's compute runs 1.5x as long from the next step"
        assert straggle_ranks(traced_step(w, tmp_path / "r1.json.gz")) == {1}
        assert w.slow(stage=0, factor=2) == [2.0, 2.0]          # pp 1: stage 0 is every rank
        assert straggle_ranks(traced_step(w, tmp_path / "s0.json.gz")) == {0, 1}
        assert w.slow() == [1.0, 1.0]
        assert w.slow_text() == "no straggler (cleared with slow off)"
        assert straggle_ranks(traced_step(w, tmp_path / "off.json.gz")) == set()
        for kw, needle in ((dict(rank=2, factor=1.5), "rank 2 is outside 0..1"),
                           (dict(stage=1, factor=1.5), "stage 1 is outside 0..0"),
                           (dict(rank=1, factor=0.5), "must be >= 1"),
                           (dict(rank=1), "needs factor=F"),
                           (dict(factor=1.5), "needs rank=R or stage=S"),
                           (dict(rank=0, stage=0, factor=2), "one rank or one stage")):
            with pytest.raises(ValueError, match=needle):
                w.slow(**kw)
        w.reset()                                                # fresh engines: the Plan's
        assert w.slowed is None and w.slow_text() == "no straggler"


def test_plan_straggler_is_replaced_live(tmp_path):
    with World(timeout_s=180) as w:
        w.plan("custom", model="tiny", dp=2, slow_rank="0=2")
        w.launch()
        assert w.slow_text() == "straggler as planned: slow_rank 0=2"
        assert straggle_ranks(traced_step(w, tmp_path / "plan.json.gz")) == {0}
        assert w.slow(rank=1, factor=1.5) == [1.0, 1.5]          # replaces the Plan's rank 0
        assert straggle_ranks(traced_step(w, tmp_path / "live.json.gz")) == {1}


@pytest.mark.parametrize("plan", ["dp2", "pp2xdp2"])
def test_same_world_blame_names_rank_1_and_its_slowdown_matches_the_step_ratio(tmp_path, plan):
    """pp 2 x dp 2: rank 1 is dp 1 on stage 0. The measurement is `partui bench blame`'s (the
    figures its table prints); a timing one, so it asks for a quiet machine (PARTUI_QUIET=1)."""
    if os.environ.get("PARTUI_QUIET") != "1":
        pytest.skip("a timing measurement: run it with PARTUI_QUIET=1 on a machine with nothing "
                    "else running, or `partui bench blame` (issue 27's same-world 10% agreement)")
    got = measure(plan_fields(plan), MODEL, 1, 1.5, ROUNDS, BLOCK, str(tmp_path))
    figures = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in got.items())
    if got["noise_floor"] > 1 + TOLERANCE:   # measured on a shared machine: 0.99 to 1.12
        pytest.skip(f"this machine's noise alone reads as a straggler past {TOLERANCE:.0%}, so "
                    f"neither the 10% comparison nor the ranking can be told from it: {figures}")
    assert got["worst_worker"] == 1 and got["top_dp"] == 1 and got["top_stage"] == 0, figures
    assert abs(agreement(got)[0]) <= TOLERANCE or within_floor(got, TOLERANCE), figures


def test_the_verdict_allows_a_miss_only_as_far_as_the_noise_floor_reaches():
    row = dict(step_ratio=1.2, named=True)
    assert verdict(dict(row, blame_slowdown=1.3, noise_floor=1.0), 0.10) == "ok"      # +8.3%
    assert verdict(dict(row, blame_slowdown=1.344, noise_floor=1.05), 0.10) == \
        "off by 12%, within the noise floor"                    # /1.05: +6.7%
    assert verdict(dict(row, blame_slowdown=1.344, noise_floor=1.01), 0.10) == "off by 12%"  # +10.9%
    assert verdict(dict(row, blame_slowdown=1.2, noise_floor=1.0, named=False), 0.10) == \
        "rank not named first"
    assert verdict(dict(row, blame_slowdown=1.5, noise_floor=1.2), 0.10) == \
        "off by 25%; machine too busy to tell (noise floor 1.20)"


def test_the_bench_refuses_a_plan_it_cannot_read(capsys):
    for text, needle in (("dp2xx", "joined by x"), ("dp2xdp2", "names a dimension twice"),
                         ("zz2", "joined by x")):
        with pytest.raises(SystemExit) as e:
            bench_blame(["--plans", text])
        assert e.value.code == 2 and needle in capsys.readouterr().err
    for argv, needle in ((["--factor", "1"], "must be > 1"),
                         (["--plans", "dp2", "--rank", "5"], "outside 0..1 of its 2 ranks"),
                         (["--plans", "tp3"], "tp 3 does not divide 8 heads"),
                         (["--keep", "/proc/partui-nope"], "pick a writable folder")):
        with pytest.raises(SystemExit) as e:             # each before any rank is launched
            bench_blame(argv)
        assert e.value.code == 2 and needle in capsys.readouterr().err


def test_the_bench_keeps_the_slowed_and_unslowed_steps_apart(tmp_path):
    """The machinery the measurement stands on, in CI: the slowed trace holds rank 1's stretch and
    only it, the unslowed one none, and every figure is filled."""
    got = measure(plan_fields("dp2"), "tiny", 1, 1.5, 2, 1, str(tmp_path))
    assert straggle_ranks(str(tmp_path / "slowed.json.gz")) == {1}
    assert straggle_ranks(str(tmp_path / "unslowed.json.gz")) == set()
    assert got["slowed_ms"] > 0 and got["unslowed_ms"] > 0 and got["blame_slowdown"] >= 1
    assert 0 <= got["gaps_pct"] < 100 and got["worst_worker"] in (0, 1)
