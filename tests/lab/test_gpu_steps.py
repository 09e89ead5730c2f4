"""One reading of a torch.profiler GPU trace: each kernel in the step whose CPU-side launch it follows, and
every view of `partui report` counting the same kernels. A hand-built trace whose GPU lags its CPU by most
of a step pins the attribution; DeepSeek's real trace is held to a sweep written here, apart from the
report's code; what a GPU trace cannot give reads '-' / null."""
import gzip
import json
import os
import re

import pandas as pd
import pytest
from interval_oracle import merged

from partui.analysis import load, overlap
from partui.analysis.gpu.gpu_steps import counted_kernels
from partui.cli import main

LAUNCHES = [("cuda_runtime", "cudaLaunchKernel"), ("cuda_driver", "cuLaunchKernel"),
            ("cuda_runtime", "cudaLaunchKernelExC"), ("cuda_runtime", "cudaGraphLaunch"),
            ("cuda_runtime", "hipLaunchKernel"), ("cuda_runtime", "hipModuleLaunchKernel")]
LAG = 85   # us of each 100 us step the GPU runs behind the CPU


def lagging_trace(cat="cuda_runtime", api="cudaLaunchKernel") -> dict:
    """ProfilerStep#1..3 on the CPU, [0,100) [100,200) [200,300). Step n (from 0) launches a gemm at 100n+10
    and an NCCL all-reduce at 100n+20 through `api`; the GPU runs them LAG us late: gemm [100n+85, 100n+145),
    all-reduce [100n+135, 100n+165). So step n's kernels run mostly in step n+1's CPU window (the last
    step's past every window). One more gemm, launched before the first step, belongs to none."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n + 1}", "pid": 1, "tid": 1,
           "ts": 100 * n, "dur": 100} for n in range(3)]
    kernels = [(100 * n + 10, "sm90_gemm", 100 * n + LAG, 60) for n in range(3)]
    kernels += [(100 * n + 20, "ncclDevKernel_AllReduce_Sum_f32", 100 * n + LAG + 50, 30) for n in range(3)]
    kernels.append((-50, "sm90_gemm", -40, 10))
    for corr, (launch, name, ts, dur) in enumerate(kernels, start=1):
        ev.append({"ph": "X", "cat": cat, "name": api, "pid": 1, "tid": 1, "ts": launch, "dur": 2,
                   "args": {"correlation": corr}})
        stream = 13 if name.startswith("nccl") else 7
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                   "args": {"correlation": corr, "stream": stream}})
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": ev}


def report_json(capsys, *args):
    assert main(["report", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("cat, api", LAUNCHES)
def test_a_kernel_belongs_to_the_step_that_launched_it_whatever_the_api(tmp_path, capsys, cat, api):
    path = tmp_path / "lag.json"
    path.write_text(json.dumps(lagging_trace(cat, api)))
    steps = report_json(capsys, str(path), "--by", "step")["rows"]
    # each step: its gemm [85,145) and all-reduce [135,165) (shifted by 100 a step): window 80, overlap 10
    want = {"window_ms": 0.080, "compute_ms": 0.060, "comm_ms": 0.030, "overlapped_ms": 0.010,
            "exposed_comm_ms": 0.020, "idle_ms": 0.0, "wait_ms": None}
    assert [r["step"] for r in steps] == [1, 2, 3]
    for row in steps:
        assert {k: row[k] for k in want} == pytest.approx(want)


def lagging_with_gemm(tmp_path, ts, dur):
    """The lagging trace plus one gemm no CPU call launched (no correlation), at ts for dur us, loaded."""
    doc = lagging_trace()
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 0, "tid": 7, "ts": ts,
                               "dur": dur, "args": {"stream": 7}})
    path = tmp_path / "lag.json"
    path.write_text(json.dumps(doc))
    return load(str(path))


def test_each_kernel_carries_its_launching_step_and_an_unclaimed_one_the_last_begun(tmp_path):
    """Cut to CPU windows, step 1 would hold 15 us of its gemm and none of its all-reduce; here each step
    holds its own 60 and 30 us. A kernel no CPU call claims (no correlation) runs at 250: it cannot have run
    before its launch, so it is the last step's begun by then (3); the pre-step gemm is no step's."""
    df = lagging_with_gemm(tmp_path, ts=250, dur=5)
    gpu = df[df["device"] == "gpu"].sort_values("ts")
    assert gpu["step"].tolist()[0] != gpu["step"].tolist()[0]                 # NaN: launched before step 1
    assert gpu.loc[gpu["ts"] == 250, "step"].tolist() == [3]
    assert sorted(gpu["step"].dropna().astype(int).tolist()) == [1, 1, 2, 2, 3, 3, 3]
    rank = overlap(df, "rank").iloc[0]
    assert (rank["compute_ms"], rank["comm_ms"], rank["overlapped_ms"]) == pytest.approx((0.185, 0.09, 0.03))


def test_every_view_of_the_lagging_trace_counts_the_same_kernels(tmp_path, capsys):
    path = tmp_path / "lag.json"
    path.write_text(json.dumps(lagging_trace()))
    doc = report_json(capsys, str(path))
    main_row, gpu = doc["rows"][0], doc["gpu"][0]
    assert (main_row["window_ms"], main_row["comm_ms"], main_row["overlapped_ms"]) == pytest.approx((0.24, 0.09, 0.03))
    assert (gpu["gpu_window_ms"], gpu["kernel_comm_ms"], gpu["kernel_overlapped_ms"], gpu["kernel_compute_ms"]) == \
        pytest.approx((0.24, 0.09, 0.03, 0.18))
    assert [(f["kernels"], f["kernel_ms"]) for f in doc["comm_kernels"]] == [(3, pytest.approx(0.09))]
    assert sum(s["kernels"] for s in doc["streams"]) == 6    # the pre-step gemm counts nowhere
    ops = report_json(capsys, str(path), "--by", "op")["rows"]
    assert [(o["op"], o["ops"], o["bytes"]) for o in ops] == [("all_reduce", 3, None)]
    assert (ops[0]["comm_ms"], ops[0]["overlapped_ms"]) == pytest.approx((0.09, 0.03))
    vs = report_json(capsys, str(path), "--vs", str(path))["rows"][0]   # a step on the GPU: its kernels' 80 us
    assert (vs["world_step_ms"], vs["comm_ms"], vs["overlapped_ms"]) == pytest.approx((0.08, 0.09, 0.03))


def test_what_a_gpu_trace_cannot_give_prints_a_dash_and_its_definition_says_why(tmp_path, capsys):
    path = tmp_path / "lag.json"
    path.write_text(json.dumps(lagging_trace()))
    assert main(["report", str(path), "--by", "op"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip().startswith("all_reduce"))
    assert row.split()[3] == "-"                          # bytes: op group ops bytes ...
    assert "bytes: bytes moved" in out and "no op of the row recorded its size" in out
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    header, row = out.splitlines()[:2]
    assert row.split()[header.split().index("wait_ms")] == "-"
    assert "where the trace records no waits" in out


# ---------------------------------------------------------------- DeepSeek's trace, by a sweep of its own

DEEPSEEK = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "real-traces",
                        "deepseek-profile-data", "train.json.gz")


def oracle(path):
    """Per step, in ms, from the json alone: kernels by the ProfilerStep holding their launching call (the
    CPU event with their correlation id); DeepEP's kernels comm, the other kernels compute."""
    with gzip.open(path, "rt") as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    steps = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in ev
             if re.fullmatch(r"ProfilerStep#\d+", e["name"])}
    launch = {}
    for e in ev:
        corr = e.get("args", {}).get("correlation")
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and corr is not None:
            launch.setdefault(corr, e["ts"])
    per = {}
    for e in ev:
        if e.get("cat") != "kernel" or e["dur"] <= 0:
            continue
        t = launch[e["args"]["correlation"]]
        step = next(n for n, (a, b) in steps.items() if a <= t <= b)
        per.setdefault(step, []).append(("dpsk::ep::" in e["name"], e["ts"], e["ts"] + e["dur"]))
    out = {}
    for step, ks in per.items():
        comm = merged([(a, b) for c, a, b in ks if c])
        comp = merged([(a, b) for c, a, b in ks if not c])
        both = sum(max(0, min(b, d) - max(a, c)) for a, b in comm for c, d in comp)
        out[step] = {"window_ms": (max(b for *_, b in ks) - min(a for _, a, _ in ks)) / 1e3,
                     "compute_ms": sum(b - a for a, b in comp) / 1e3, "comm_ms": sum(b - a for a, b in comm) / 1e3,
                     "overlapped_ms": both / 1e3, "kernels": sum(c for c, *_ in ks),
                     "summed_ms": sum(b - a for c, a, b in ks if c) / 1e3}
    return out


@pytest.mark.skipif(not os.path.exists(DEEPSEEK), reason="../shared/real-traces is absent (the real traces live "
                                                         "beside the checkout, never in it)")
def test_deepseek_every_view_gives_one_comm_and_one_overlap(capsys):
    want = oracle(DEEPSEEK)
    assert list(want) == [1]
    w = want[1]
    figures = ("window_ms", "compute_ms", "comm_ms", "overlapped_ms")
    doc = report_json(capsys, DEEPSEEK)
    assert {k: doc["rows"][0][k] for k in figures} == pytest.approx({k: w[k] for k in figures}, abs=1e-3)
    step = report_json(capsys, DEEPSEEK, "--by", "step")["rows"]
    assert [r["step"] for r in step] == [1]
    assert {k: step[0][k] for k in figures} == pytest.approx({k: w[k] for k in figures}, abs=1e-3)
    gpu = doc["gpu"][0]
    assert (gpu["gpu_window_ms"], gpu["kernel_compute_ms"], gpu["kernel_comm_ms"], gpu["kernel_overlapped_ms"]) == \
        pytest.approx((w["window_ms"], w["compute_ms"], w["comm_ms"], w["overlapped_ms"]), abs=1e-3)
    assert [(f["kernels"], f["kernel_ms"]) for f in doc["comm_kernels"]] == [(w["kernels"], pytest.approx(w["summed_ms"], abs=1e-3))]
    ops = report_json(capsys, DEEPSEEK, "--by", "op")["rows"]   # DeepEP's kernels share one stream: no op overlaps another
    assert sum(o["ops"] for o in ops) == w["kernels"]
    assert (sum(o["comm_ms"] for o in ops), sum(o["overlapped_ms"] for o in ops)) == \
        pytest.approx((w["comm_ms"], w["overlapped_ms"]), abs=1e-2)
    assert all(o["bytes"] is None for o in ops) and doc["rows"][0]["wait_ms"] is None
    parts = report_json(capsys, DEEPSEEK, "--by", "pair")["rows"]   # every comm kernel is some part's
    assert (sum(p["a2a_ms"] for p in parts), sum(p["a2a_under_ms"] for p in parts)) == \
        pytest.approx((w["comm_ms"], w["overlapped_ms"]), abs=1e-2)
    vs = report_json(capsys, DEEPSEEK, "--vs", DEEPSEEK)["rows"][0]
    assert (vs["world_step_ms"], vs["comm_ms"], vs["overlapped_ms"]) == \
        pytest.approx((w["window_ms"], w["comm_ms"], w["overlapped_ms"]), abs=1e-3)
    assert main(["report", DEEPSEEK]) == 0
    assert f"DeepEP {w['kernels']} kernels" in capsys.readouterr().out


def test_a_cpu_kineto_trace_records_no_wait_nor_bytes_either(tmp_path, capsys):
    """gloo and aten ops of a plain torch.profiler CPU trace: comm in flight is measured, blocking and sizes
    are not, so wait_ms and bytes read null (a whole directory of such ranks the same)."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
          {"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": 50, "dur": 100}]
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rank in (0, 1):
        (folder / f"rank-{rank}.json").write_text(json.dumps(
            {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": ev}))
    for path in (str(folder / "rank-0.json"), str(folder)):
        rows = report_json(capsys, path)["rows"]
        assert [(r["comm_ms"], r["wait_ms"]) for r in rows] == [(pytest.approx(0.1), None)] * len(rows)
        ops = report_json(capsys, path, "--by", "op")["rows"]
        assert [(o["op"], o["bytes"]) for o in ops] == [("all_reduce", None)]


def test_the_counted_kernels_narrowed_to_a_views_columns_are_the_same_rows(tmp_path):
    """counted_kernels(df, columns) is counted_kernels(df)[columns]: the same kernels (the pre-step gemm
    and a zero-length kernel out, six in), only fewer columns copied."""
    df = lagging_with_gemm(tmp_path, ts=150, dur=0)
    every = counted_kernels(df)
    assert len(every) == 6 and every["end"].gt(every["ts"]).all() and every["step"].notna().all()
    narrow = counted_kernels(df, ["rank", "track", "kind", "ts", "end"])
    pd.testing.assert_frame_equal(narrow, every[["rank", "track", "kind", "ts", "end"]])
