"""hta_filter.hta_rows (HTA's kept kernels as a mask, looked up a chunk of rows at a time) against a plain
loop over the rows: a kernel is kept where a CPU event of its rank with its correlation id starts (rounded
up) before its rank's last ProfilerStep begins (or up to its end); on both paths (ids packed into int64,
and pandas' pairs where an id is not a whole number), with chunks far smaller than the table."""
import math

import numpy as np
import pandas as pd
import pytest

from partui.analysis.gpu import hta_filter


def random_table(seed: int, fractional: bool) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for rank in (0, 1, 3):
        for k in range(3 if rank != 3 else 1):   # rank 3 has one step: its own bound is its only one
            rows.append((rank, f"ProfilerStep#{k}", "cpu", 100.0 * k + 0.5, 100.0 * k + 90.4, np.nan))
        for _ in range(60):
            corr = float(rng.integers(0, 40))
            rows.append((rank, "cudaLaunchKernel", "cpu", float(rng.uniform(0, 300)), 0.0, corr))
            rows.append((rank, "gemm", "gpu", float(rng.uniform(0, 300)), 0.0, float(rng.integers(0, 45))))
        rows.append((rank, "gemm", "gpu", 5.0, 6.0, np.nan))      # no id: launched by nothing
    if fractional:
        rows.append((1, "cudaLaunchKernel", "cpu", 7.0, 8.0, 2.5))  # not packable: pandas' pairs
        rows.append((1, "gemm", "gpu", 9.0, 10.0, 2.5))
    df = pd.DataFrame(rows, columns=["rank", "name", "device", "ts", "end", "correlation"])
    df["name"] = df["name"].astype("category")
    return df.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def by_hand(df: pd.DataFrame, include_last: bool) -> list:
    steps = [r for r in df.itertuples() if r.device == "cpu" and str(r.name).startswith("ProfilerStep#")]
    bound = {}
    for r in steps:
        edge = math.floor(r.end) if include_last else math.ceil(r.ts)
        if math.ceil(r.ts) >= max((math.ceil(s.ts) for s in steps if s.rank == r.rank)):
            bound[r.rank] = edge       # the rank's last step (the latest start)
    launched = {(r.rank, r.correlation) for r in df.itertuples() if r.device == "cpu" and r.rank in bound
                and not math.isnan(r.correlation)
                and (math.ceil(r.ts) <= bound[r.rank] if include_last else math.ceil(r.ts) < bound[r.rank])}
    return [r.device == "gpu" and (r.rank, r.correlation) in launched for r in df.itertuples()]


@pytest.mark.parametrize("fractional", [False, True])
@pytest.mark.parametrize("include_last", [False, True])
def test_hta_rows_is_the_loops_mask_in_chunks(monkeypatch, fractional, include_last):
    monkeypatch.setattr(hta_filter, "LOOKUP_ROWS", 17)
    for seed in range(4):
        df = random_table(seed, fractional)
        got = hta_filter.hta_rows(df, include_last)
        assert got.tolist() == by_hand(df, include_last)
        assert 0 < got.sum() < (df["device"] == "gpu").sum()
