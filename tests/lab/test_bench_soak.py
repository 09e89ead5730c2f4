"""`partui bench soak`'s figures: resident set read from /proc, growth between two steps, the
verdict line naming its target, and the counts it refuses."""
import mmap
import os

import pytest

from partui.bench.soak import main, rss_kib, soak, verdict


def test_rss_grows_by_what_a_touched_buffer_holds():
    # fresh anonymous pages, each written: a bytearray could reuse pages this process already holds
    # (in a long pytest run it did, and the RSS rightly did not move)
    size = 64 * 1024 * 1024
    buf = mmap.mmap(-1, size)
    before = rss_kib(os.getpid())
    for at in range(0, size, mmap.PAGESIZE):       # one byte a page, no 64 MiB temporary
        buf[at] = 1
    after = rss_kib(os.getpid())
    buf.close()
    assert 60 * 1024 <= after - before <= 70 * 1024, (before, after)


def test_a_short_soak_reports_every_process_and_keeps_its_bounded_history():
    said = []
    out = soak(dp=2, steps=12, start=4, history_lines=5, say=said.append)
    assert [r[0] for r in out["rows"]] == ["controller", "rank 0", "rank 1"]
    for _, a, b, growth in out["rows"]:
        assert a > 0 and b > 0 and growth == 100.0 * (b - a) / a
    assert out["history_kept"] == 5 and out["history_bytes_per_line"] > 0
    assert [t.split(" · ")[0] for t in said] == [f"soak: step {i}/12" for i in range(1, 13)]


def soaked(controller, *ranks, kept=64, bound=64):
    rows = [("controller", 1000, 1000, controller)] + [(f"rank {r}", 1000, 1000, g)
                                                       for r, g in enumerate(ranks)]
    return {"rows": rows, "steps": 1000, "start": 100, "history_kept": kept, "history_lines": bound}


def test_the_verdict_names_its_target():
    assert verdict(soaked(0.4, 0.1, 0.3), 2.0) == (
        True, "verdict: ok — controller +0.4%, ranks +0.1% .. +0.3% over steps 100..1000 "
              "(target <= 2%); 64 step lines kept (bound 64)")
    assert verdict(soaked(41.0, 0.1, 0.4), 2.0) == (
        False, "verdict: FAILED — controller +41.0% > 2%, ranks +0.1% .. +0.4% over steps "
               "100..1000 (target <= 2%); 64 step lines kept (bound 64)")
    assert verdict(soaked(0.4, 0.1, 3.5), 2.0) == (
        False, "verdict: FAILED — controller +0.4%, ranks +0.1% .. +3.5% (rank 1 > 2%) over steps "
               "100..1000 (target <= 2%); 64 step lines kept (bound 64)")
    assert verdict(soaked(0.4, 0.1, 0.3, kept=1000), 2.0) == (
        False, "verdict: FAILED — controller +0.4%, ranks +0.1% .. +0.3% over steps 100..1000 "
               "(target <= 2%); 1000 step lines kept > their bound 64")


@pytest.mark.parametrize("argv, says", [
    (["--dp", "0"], "argument --dp: 0 must be >= 1: e.g. --dp 4"),
    (["--dp", "-1"], "argument --dp: -1 must be >= 1: e.g. --dp 4"),
    (["--dp", "two"], "argument --dp: 'two' is not a whole number: e.g. --dp 4"),
    (["--steps", "0"], "argument --steps: 0 must be >= 1: e.g. --steps 1000"),
    (["--from-step", "0"], "argument --from-step: 0 must be >= 1: e.g. --from-step 100"),
    (["--history-lines", "0"], "argument --history-lines: 0 must be >= 1: e.g. --history-lines 64"),
    (["--max-growth", "-1"], "argument --max-growth: -1 must be above 0 (a percent): e.g. --max-growth 2"),
    (["--steps", "50"], "--from-step 100 must be in 1..49: try --from-step 5 (or more --steps)"),
    (["--dp", "3"], "--dp 3: global batch 8 is not divisible by dp 3"),
])
def test_bad_counts_are_refused_before_a_world_starts(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and says in capsys.readouterr().err
