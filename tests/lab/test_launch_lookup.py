"""gpu_steps.launch_times (one rank without masks, several ranks masked) against a hand-written loop:
each kernel's launch is the earliest CPU row of its rank carrying its correlation id."""
import numpy as np
import pandas as pd
import pytest

from partui.analysis.gpu import gpu_steps
from partui.analysis.gpu.gpu_steps import launch_times


def loop_oracle(df, kernels):
    cpu = df[(df["device"] == "cpu") & df["correlation"].notna()]
    out = []
    for rank, corr in zip(kernels["rank"], kernels["correlation"]):
        ts = cpu.loc[(cpu["rank"] == rank) & (cpu["correlation"] == corr), "ts"]
        out.append(ts.min() if len(ts) else np.nan)
    return np.array(out, dtype=float)


@pytest.mark.parametrize("lookup_rows", [7, 1 << 20])  # many pieces of kernels, one
@pytest.mark.parametrize("ranks", [1, 3])
def test_launch_times_is_each_kernels_earliest_call_of_its_rank(ranks, lookup_rows, monkeypatch):
    monkeypatch.setattr(gpu_steps, "LOOKUP_ROWS", lookup_rows)
    rng = np.random.default_rng(11)
    n = 600
    df = pd.DataFrame({"rank": rng.integers(0, ranks, n) + 4, "device": rng.choice(["cpu", "gpu"], n),
                       "correlation": rng.integers(0, 80, n).astype(float), "ts": rng.integers(0, 40, n) * 1.0})
    df.loc[df.index[::9], "correlation"] = np.nan
    kernels = df[df["device"] == "gpu"][["rank", "correlation"]]
    got, want = launch_times(df, kernels), loop_oracle(df, kernels)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(want).any() and (~np.isnan(want)).any()


@pytest.mark.parametrize("order", ["each id once, in order", "in order, an id twice", "shuffled"])
def test_launch_times_of_calls_already_in_id_order(order):
    """The lookup's shortcut for calls written in id order, and the sort it skips, read the same."""
    rng = np.random.default_rng(5)
    corr = np.arange(0, 300, 3, dtype=float)                     # ids 0, 3, ...: kernels also miss
    if order == "in order, an id twice":
        corr = np.sort(np.append(corr, corr[10]))
    ts = np.cumsum(rng.random(len(corr)))
    if order == "in order, an id twice":
        ts[11] = ts[10] - 5.0                                   # the id's second call is its earliest
    if order == "shuffled":
        corr = rng.permutation(corr)
    cpu = pd.DataFrame({"rank": 0, "device": "cpu", "correlation": corr, "ts": ts})
    gpu = pd.DataFrame({"rank": 0, "device": "gpu", "correlation": rng.permutation(300).astype(float),
                        "ts": 0.0})
    df = pd.concat([cpu, gpu], ignore_index=True)
    kernels = gpu[["rank", "correlation"]]
    np.testing.assert_array_equal(launch_times(df, kernels), loop_oracle(df, kernels))


def test_kernel_steps_of_two_ranks_together_are_each_ranks_alone():
    from partui.analysis.gpu.gpu_steps import kernel_steps
    rows = []
    for rank, shift in ((0, 0.0), (1, 5.0)):  # rank 1's steps start later: the lookups must not mix
        rows += [(rank, "cpu", "step", 0 + shift, 50 + shift, 1.0, np.nan),
                 (rank, "cpu", "step", 50 + shift, 100 + shift, 2.0, np.nan),
                 (rank, "cpu", "other", 10 + shift, 11 + shift, np.nan, 1.0),
                 (rank, "cpu", "other", 52 + shift, 53 + shift, np.nan, 2.0),
                 (rank, "gpu", "compute", 60 + shift, 70 + shift, np.nan, 1.0),  # launched in step 1
                 (rank, "gpu", "compute", 54 + shift, 58 + shift, np.nan, 2.0),
                 (rank, "gpu", "compute", 3 + shift, 4 + shift, np.nan, 9.0)]   # unclaimed: by its start
    df = pd.DataFrame(rows, columns=["rank", "device", "kind", "ts", "end", "step", "correlation"])
    together = kernel_steps(df)
    alone = np.concatenate([kernel_steps(df[df["rank"] == r].reset_index(drop=True)) for r in (0, 1)])
    np.testing.assert_array_equal(together, alone)
    assert together[4:7].tolist() == [1.0, 2.0, 1.0]
