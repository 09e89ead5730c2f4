"""`partui bench soak`'s figures: resident set read from /proc, growth between two steps."""
import os

from partui.bench.soak import rss_kib, soak


def test_rss_grows_by_what_a_touched_buffer_holds():
    before = rss_kib(os.getpid())
    buf = bytearray(64 * 1024 * 1024)              # 64 MiB, zero-filled: every page touched
    after = rss_kib(os.getpid())
    assert 60 * 1024 <= after - before <= 70 * 1024, (before, after)
    del buf


def test_a_short_soak_reports_every_process():
    out = soak(dp=2, steps=12, start=4)
    assert [r[0] for r in out["rows"]] == ["controller", "rank 0", "rank 1"]
    for _, a, b, growth in out["rows"]:
        assert a > 0 and b > 0 and growth == 100.0 * (b - a) / a
    assert out["history_bytes_per_step"] > 0
