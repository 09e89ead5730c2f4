"""A directory of per-rank torch.profiler (Kineto) GPU traces, HTA's input: read as one trace, and
HTA's comm-comp overlap under its last-step rule, by hand and (when installed) against HTA itself."""
import json
import logging
import os

import pytest

from partui.analysis import TraceError, hta_overlap, load
from partui.cli import main


def rank_trace(rank: int) -> dict:
    """Three ProfilerSteps [0,100], [100,200], [200,300]; each launches (cudaLaunchKernel, by
    correlation id) a gemm [t+20, t+60] and an all-reduce [t+40, t+70+10k]; the last step also
    launches a gemm [320, 370] and an all-gather [330, 390] that run after the step ended."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k + 1}", "pid": 1, "tid": 1,
           "ts": t, "dur": 100} for k, t in enumerate((0, 100, 200))]
    launches = []
    for k, t in enumerate((0, 100, 200)):
        launches += [(t + 10, "sm90_gemm", t + 20, 40, 7),
                     (t + 12, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", t + 40, 30 + 10 * k, 20)]
    launches += [(295, "sm90_gemm", 320, 50, 7), (296, "ncclDevKernel_AllGather_RING_LL", 330, 60, 20)]
    for corr, (t, name, kt, kdur, stream) in enumerate(launches, start=1):
        ids = {"correlation": corr, "External id": corr}
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                   "ts": t, "dur": 2, "args": ids})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": kt,
                   "dur": kdur, "args": {**ids, "stream": stream, "device": 0}})
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "deviceProperties": [{"id": 0, "name": "H100"}], "traceEvents": ev}


@pytest.fixture
def folder(tmp_path):
    for r in (1, 0):
        (tmp_path / f"rank{r}.pt.trace.json").write_text(json.dumps(rank_trace(r)))
    return str(tmp_path)


# default: steps 1-2 only: overlap [40,60] + [145,165] = 40 of comm 30 + 40 = 70
DEFAULT = 100 * 40 / 70
# include_last_profiler_step: + [240,260] and [330,370] = 20 + 40 more of 50 + 60 more comm
WITH_LAST = 100 * 100 / 180


def test_a_directory_is_one_multi_rank_trace_with_htas_rule(folder):
    df = load(folder)
    assert sorted(df["rank"].unique()) == [0, 1] and df.attrs["format"] == "kineto"
    assert hta_overlap(df)["comm_comp_overlap_pct"].tolist() == pytest.approx([DEFAULT] * 2)
    assert hta_overlap(df, include_last_profiler_step=True)["comm_comp_overlap_pct"].tolist() == \
        pytest.approx([WITH_LAST] * 2)


def test_the_cli_reports_the_apis_figure_under_either_rule(folder, capsys):
    for flag, want in (([], DEFAULT), (["--include-last-step"], WITH_LAST)):
        assert main(["report", folder, "--format", "json"] + flag) == 0
        rows = json.loads(capsys.readouterr().out)["rows"]
        assert [r["comm_comp_overlap_pct"] for r in rows] == pytest.approx([want] * 2, abs=1e-3)


def test_against_hta_itself(folder):
    hta = pytest.importorskip("hta.trace_analysis")
    logging.disable(logging.WARNING)   # HTA logs every parse at WARNING
    try:
        for last, want in ((False, DEFAULT), (True, WITH_LAST)):
            ta = hta.TraceAnalysis(trace_dir=folder, include_last_profiler_step=last)
            theirs = ta.get_comm_comp_overlap(visualize=False).sort_values("rank")
            ours = hta_overlap(load(folder), include_last_profiler_step=last)
            assert theirs["comp_comm_overlap_pctg"].tolist() == pytest.approx(
                ours["comm_comp_overlap_pct"].tolist(), abs=0.01)
            assert ours["comm_comp_overlap_pct"].tolist() == pytest.approx([want] * 2)
    finally:
        logging.disable(logging.NOTSET)


def test_bad_directories_say_what_to_do(tmp_path, folder):
    os.makedirs(tmp_path / "empty")
    with pytest.raises(TraceError, match="no .json or .json.gz traces in this directory"):
        load(str(tmp_path / "empty"))
    (tmp_path / "rank9.json").write_text(json.dumps(rank_trace(0)))
    with pytest.raises(TraceError, match="rank 0 again"):
        load(folder)
    (tmp_path / "rank9.json").write_text(json.dumps({"traceEvents": [], "metadata": {}}))
    with pytest.raises(TraceError, match="not a torch.profiler trace"):
        load(folder)
