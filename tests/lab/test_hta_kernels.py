"""metrics.launched_by (HTA's launch filter) against a plain set of (rank, correlation) pairs, on both of
its paths (packed int64 keys and pandas' pairs), and hta_kernels' narrow rows on a hand-built trace."""
import numpy as np
import pandas as pd
import pytest

from partui.analysis.figures import metrics


def set_oracle(gpu_rank, gpu_corr, cpu_rank, cpu_corr):
    launched = {(int(r), float(c)) for r, c in zip(cpu_rank, cpu_corr) if not np.isnan(c)}
    return np.array([not np.isnan(c) and (int(r), float(c)) in launched for r, c in zip(gpu_rank, gpu_corr)])


@pytest.mark.parametrize("ids", ["whole", "fractional", "negative", "huge"])
def test_launched_by_equals_a_set_of_pairs(ids):
    rng = np.random.default_rng(7)
    n = 2000
    gpu_rank, cpu_rank = rng.integers(0, 5, n), rng.integers(0, 5, n)
    gpu_corr, cpu_corr = rng.integers(0, 300, n).astype(float), rng.integers(0, 300, n).astype(float)
    gpu_corr[::17], cpu_corr[::13] = np.nan, np.nan
    if ids == "fractional":
        gpu_corr[1], cpu_corr[1] = 0.5, 0.5
    elif ids == "negative":
        gpu_corr[1], cpu_corr[1] = -3.0, -3.0
    elif ids == "huge":
        gpu_corr[1], cpu_corr[1] = 2.0 ** 45, 2.0 ** 45
    cpu_rank[1] = gpu_rank[1]
    got = metrics.launched_by(gpu_rank, gpu_corr, cpu_rank, cpu_corr)
    want = set_oracle(gpu_rank, gpu_corr, cpu_rank, cpu_corr)
    assert got.dtype == bool and (got == want).all()
    assert want.any() and not want.all() and got[1]


def test_launched_by_no_cpu_events_launches_nothing():
    got = metrics.launched_by(np.array([0, 1]), np.array([1.0, np.nan]), np.array([], int), np.array([]))
    assert not got.any()


def test_hta_kernels_keeps_kernels_launched_before_the_last_step():
    # rank 0: steps at 0 and 100; a launch at 10 (kept), one at 150 (after the last step begins: dropped);
    # rank 1 carries the same correlation id 1 but launched nothing: its kernel is dropped.
    rows = [(0, "ProfilerStep#1", "cpu", 0.0, 90.0, np.nan), (0, "ProfilerStep#2", "cpu", 100.0, 190.0, np.nan),
            (0, "launch", "cpu", 10.0, 11.0, 1.0), (0, "launch", "cpu", 150.0, 151.0, 2.0),
            (0, "k1", "gpu", 20.0, 30.0, 1.0), (0, "k2", "gpu", 160.0, 170.0, 2.0),
            (1, "k1", "gpu", 20.0, 30.0, 1.0)]
    df = pd.DataFrame(rows, columns=["rank", "name", "device", "ts", "end", "correlation"])
    got = metrics.hta_kernels(df)
    assert list(got.columns) == ["rank", "name", "ts", "end"]
    assert got[["rank", "name"]].values.tolist() == [[0, "k1"]]
    both = metrics.hta_kernels(df, include_last_profiler_step=True)
    assert both[["rank", "name"]].values.tolist() == [[0, "k1"], [0, "k2"]]
