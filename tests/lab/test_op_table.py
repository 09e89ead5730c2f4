"""blame refuses an op-level table it cannot trust, naming the rows, the worker or the file, before
any figure is computed: a NaN would make every figure NaN and still name a culprit; a negative
duration or a missing worker would quietly change the answer (ST without rank 5: 1.149 for 1.179)."""
import os
import shutil

import pandas as pd
import pytest

from partui.analysis.table.events import TraceError
from partui.analysis.reading.op_table import read_op_table

REAL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "real-traces",
                    "bytedance-straggler")


def table() -> pd.DataFrame:
    """dp 2 x 2 stages, two steps, one forward compute each (row i: step, dp, stage in that order)."""
    rows = [dict(dp_rank=d, stage=s, rank=2 * s + d, step=step, optype="forward-compute",
                 start_ts=float(step), duration=1.0, seq_id=0, mc=0, mb_id=0, gmc=0)
            for step in (1, 2) for d in (0, 1) for s in (0, 1)]
    return pd.DataFrame(rows)


def refused(tmp_path, df, fmt="csv") -> str:
    path = tmp_path / f"trace-x.{fmt}"
    df.to_csv(path, index=False) if fmt == "csv" else df.to_parquet(path)
    with pytest.raises(TraceError) as e:
        read_op_table(str(path))
    return str(e.value)


def test_a_good_table_reads(tmp_path):
    path = tmp_path / "ops.csv"
    table().to_csv(path, index=False)
    assert len(read_op_table(str(path))) == 8


def test_nan_and_negative_durations_name_their_rows(tmp_path):
    df = table()
    df.loc[[3, 6], "duration"] = float("nan")
    assert "duration is not a finite number at rows 3, 6" in refused(tmp_path, df)
    df = table()
    df.loc[5, "duration"] = -0.5
    assert "negative duration at row 5" in refused(tmp_path, df)
    df = table()
    df.loc[0, "start_ts"] = float("inf")
    assert "start_ts is not a finite number at row 0" in refused(tmp_path, df, "parquet")


def test_a_missing_worker_is_named(tmp_path):
    df = table()
    df = df[~((df["dp_rank"] == 1) & (df["stage"] == 0))]
    assert "no ops of dp 1 stage 0 (dp ranks 0..1 x stages 0..1)" in refused(tmp_path, df)


def test_empty_files_and_directories_are_refused(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(TraceError, match="the file is empty; an op-level trace has a header row"):
        read_op_table(str(tmp_path / "empty.csv"))
    assert "the table holds no ops" in refused(tmp_path, table().iloc[:0], "parquet")
    with pytest.raises(TraceError, match="is a directory; blame reads one op-level table"):
        read_op_table(str(tmp_path))


def test_the_jobs_meta_yaml_is_checked(tmp_path):
    df = table()
    df.to_csv(tmp_path / "trace-x.csv", index=False)
    (tmp_path / "meta-x.yaml").write_text("trial_name: x\ndp_size: 4\npp_size: 2\ntp_size: 1\n"
                                          "dsp_size: 1\nworld_size: 8\n")
    with pytest.raises(TraceError, match=r"meta-x.yaml says dp_size 4 but the table has 2 dp ranks "
                                         r"\(missing \[2, 3\]\)"):
        read_op_table(str(tmp_path / "trace-x.csv"))
    (tmp_path / "meta-x.yaml").write_text("dp_size: 2\npp_size: 2\ntp_size: 2\ndsp_size: 1\nworld_size: 4\n")
    with pytest.raises(TraceError, match="world_size 4 is not dp_size x pp_size x tp_size x dsp_size = 8"):
        read_op_table(str(tmp_path / "trace-x.csv"))
    (tmp_path / "meta-x.yaml").write_text("dp_size: 2\npp_size: 2\ntp_size: 2\ndsp_size: 1\nworld_size: 8\n")
    assert len(read_op_table(str(tmp_path / "trace-x.csv"))) == 8


@pytest.mark.skipif(not os.path.isdir(REAL), reason="../shared/real-traces is absent (the real traces live "
                                                    "beside the checkout, never in it)")
def test_st_without_rank_5_is_refused_not_misread(tmp_path):
    df = pd.read_parquet(os.path.join(REAL, "trace-ST.parquet"))
    shutil.copy(os.path.join(REAL, "meta-ST.yaml"), tmp_path / "meta-ST.yaml")
    five = df[df["rank"] == 5][["dp_rank", "stage"]].iloc[0]
    path = tmp_path / "trace-ST.parquet"
    df[df["rank"] != 5].to_parquet(path)
    with pytest.raises(TraceError, match=f"no ops of dp {five['dp_rank']} stage {five['stage']}"):
        read_op_table(str(path))
    for name in ("ST", "AR", "SE"):         # the artifact's own tables pass, with their meta files
        assert len(read_op_table(os.path.join(REAL, f"trace-{name}.parquet"))) > 0
