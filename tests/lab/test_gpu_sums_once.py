"""The GPU per-step sums swept once and handed to the views (as partui report does) give the same
tables as each view sweeping them itself."""
import json

import pandas as pd

from partui.analysis import overlap_views
from partui.analysis.reading import reader
from partui.analysis.gpu.gpu_steps import gpu_step_sums
from partui.analysis.figures.streams import gpu_overlap, stream_busy
from partui.bench.analysis import synthetic_kineto


def test_views_given_the_sums_equal_the_views_that_sweep_them(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(synthetic_kineto(400)))
    df = reader.read_table(str(path))
    sums = gpu_step_sums(df)
    assert len(sums) > 1
    for by in ("rank", "step"):
        pd.testing.assert_frame_equal(overlap_views(df, (by,), sums)[by], overlap_views(df, (by,))[by], check_exact=True)
    pd.testing.assert_frame_equal(gpu_overlap(df, sums), gpu_overlap(df), check_exact=True)
    pd.testing.assert_frame_equal(stream_busy(df, sums), stream_busy(df), check_exact=True)
    pd.testing.assert_frame_equal(gpu_step_sums(df), sums)  # the views left the sums as they were
