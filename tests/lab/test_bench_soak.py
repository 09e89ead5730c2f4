"""`partui bench soak`'s figures: resident set read from /proc, growth between two steps."""
import mmap
import os

from partui.bench.soak import rss_kib, soak


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


def test_a_short_soak_reports_every_process():
    out = soak(dp=2, steps=12, start=4)
    assert [r[0] for r in out["rows"]] == ["controller", "rank 0", "rank 1"]
    for _, a, b, growth in out["rows"]:
        assert a > 0 and b > 0 and growth == 100.0 * (b - a) / a
    assert out["history_bytes_per_step"] > 0
