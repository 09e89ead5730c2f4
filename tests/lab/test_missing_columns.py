"""The number columns no event fills (events.missing: one shared NaN, no memory a row) read as the
plain all-NaN columns they replace: the same frame through table, finish and a torch.profiler load,
kept shared as rows are dropped or reordered, and writable (the frame takes its own copy)."""
import numpy as np
import pandas as pd

from partui.analysis.table import events
from partui.analysis.reading import reader
from partui.analysis.table.events import COLUMNS, finish, is_missing, missing, table
from partui.bench.analysis import synthetic_kineto

UNFILLED_BY_KINETO = ["mb", "chunk", "layer", "bytes", "peer", "cpu_us", "transfer_us"]


def test_missing_is_nan_shared_and_read_only():
    col = missing(5)
    assert col.dtype == np.float64 and np.isnan(col).all() and len(col) == 5
    assert col.strides == (0,) and not col.flags.writeable and is_missing(col)
    assert not is_missing(np.full(5, np.nan)) and not is_missing(np.zeros(0)) and not is_missing(np.zeros(3)[:1])


def columns_with(nan_column, ts):
    n = len(ts)
    cols = {"name": np.array(["a", "b", "c", "d"][:n], dtype=object), "cat": np.array(["k"] * n, dtype=object),
            "pid": np.zeros(n, np.int64), "tid": np.arange(n, dtype=np.int64), "ts": np.array(ts), "dur": np.ones(n)}
    for key in events.ARG_KEYS:
        cols[key] = np.full(n, None, dtype=object) if key in events.TEXT_ARGS else nan_column(n)
    return cols


def finished(df):
    df["rank"], df["track"], df["kind"], df["device"] = 0, "t", "compute", "gpu"
    df.attrs["unrecorded"] = ("wait",)
    return finish(df, consume=True)


def test_table_and_finish_equal_the_plain_nan_frame_and_keep_the_columns_shared():
    ts = [3.0, np.nan, 1.0, 2.0]  # one row without a time dropped; the rest out of order
    shared = finished(table(columns_with(missing, ts)))
    plain = finished(table(columns_with(lambda n: np.full(n, np.nan), ts)))
    pd.testing.assert_frame_equal(shared, plain, check_exact=True)
    assert list(shared.columns) == COLUMNS and shared["ts"].tolist() == [1.0, 2.0, 3.0]
    assert shared.attrs == {"unrecorded": ("wait",)}
    for key in UNFILLED_BY_KINETO:
        assert is_missing(shared[key].array), key
        assert not is_missing(plain[key].array), key


def test_a_torch_profiler_load_shares_its_unfilled_columns_and_they_take_writes(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_text(__import__("json").dumps(synthetic_kineto(300)))
    df = reader.read_table(str(path))
    for key in UNFILLED_BY_KINETO:
        assert is_missing(df[key].array) and df[key].isna().all(), key
    picked = df[df["device"] == "gpu"]
    assert picked["mb"].isna().all() and len(picked) > 0
    df.loc[df.index[0], "mb"] = 1.0  # copy on write: the frame's own column now
    assert df["mb"].iloc[0] == 1.0 and df["mb"].iloc[1:].isna().all() and not is_missing(df["mb"].array)


def test_one_ranks_time_order_is_lexsorts_with_ties_and_none_when_sorted():
    rng = np.random.default_rng(3)
    ts = rng.integers(0, 50, 400).astype(float)  # many ties: file order must hold among them
    rank = np.full(400, 7)
    order = events.rank_time_order(rank, ts)
    assert (order == np.lexsort((ts, rank))).all()
    assert events.rank_time_order(rank, ts[order]) is None
    assert events.rank_time_order(np.zeros(0, np.int64), np.zeros(0)) is None


def test_finish_consuming_drops_the_scratch_columns_and_equals_the_copying_finish():
    ts = [3.0, 1.0, 2.0]
    consumed, copied = table(columns_with(missing, ts)), table(columns_with(missing, ts))
    for df in (consumed, copied):
        df["rank"], df["track"], df["kind"], df["device"] = 0, "t", "compute", "gpu"
    got, want = finish(consumed, consume=True), finish(copied)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert len(consumed.columns) == 0 and "pid" in copied.columns
