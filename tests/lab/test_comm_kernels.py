"""Comm kernel families, GPU-side figures per rank and stream, HTA's exact rule, and the bad inputs of
torch.profiler traces: each on a hand-built Kineto file with known answers."""
import gzip
import json

import pytest

from partui.analysis import TraceError, hta_overlap, load
from partui.analysis.gpu.comm_kernels import family_lines, family_table
from partui.analysis.figures.streams import gpu_overlap, stream_busy
from partui.cli import main


def kineto(kernels, world=2, rank=0, cpu=()) -> dict:
    """kernels: (name, stream, ts, dur[, cat]) on GPU 0; cpu: extra CPU events."""
    ev = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": s, "args": {"name": f"stream {s}"}}
          for s in sorted({k[1] for k in kernels})]
    for i, k in enumerate(kernels, start=1):
        name, stream, ts, dur = k[:4]
        ev.append({"ph": "X", "cat": k[4] if len(k) > 4 else "kernel", "name": name, "pid": 0, "tid": stream,
                   "ts": ts, "dur": dur, "args": {"stream": stream, "correlation": i, "device": 0}})
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "traceEvents": ev + list(cpu)}


# stream 7: gemm [0,100], gemm [150,200]; stream 9: DeepEP dispatch [50,180], NCCL [210,230],
# my_a2a [240,250] (comm only with --comm-kernels); stream 11: a peer copy [20,40], a memset [0,300]
KERNELS = [("sm90_gemm", 7, 0, 100), ("sm90_gemm", 7, 150, 50),
           ("void dpsk::ep::internode::dispatch<false>(int4*)", 9, 50, 130),
           ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 9, 210, 20), ("my_a2a_kernel", 9, 240, 10),
           ("Memcpy PtoP (Device -> Device)", 11, 20, 20, "gpu_memcpy"),
           ("Memset (Device)", 11, 0, 300, "gpu_memset")]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(kineto(KERNELS)))
    return str(path)


def test_each_family_is_counted_and_a_pattern_adds_one(trace):
    fam = family_table(load(trace)).set_index("family")
    assert fam["kernels"].to_dict() == {"DeepEP": 1, "NCCL": 1, "p2p memcpy": 1}
    assert fam["kernel_ms"].to_dict() == pytest.approx({"DeepEP": 0.13, "NCCL": 0.02, "p2p memcpy": 0.02})
    fam = family_table(load(trace, comm_kernels=["a2a"])).set_index("family")
    assert fam.loc["--comm-kernels", "kernels"] == 1 and len(fam) == 4


def test_gpu_overlap_exposed_and_compute_idle(trace):
    g = gpu_overlap(load(trace)).iloc[0]
    # compute [0,100] u [150,200] = 150; comm [20,180] u [210,230] = 180 (p2p copy inside dispatch);
    # comm under compute: [20,100] + [150,180] = 110; window [0,250]: the memset is neither class
    assert g["gpu_window_ms"] == pytest.approx(0.25)
    assert g["kernel_compute_ms"] == pytest.approx(0.16)
    assert g["kernel_comm_ms"] == pytest.approx(0.17)
    assert g["kernel_overlapped_ms"] == pytest.approx(0.10)
    assert g["gpu_exposed_comm_ms"] == pytest.approx(0.07)
    assert g["compute_idle_ms"] == pytest.approx(0.25 - 0.16)
    s = stream_busy(load(trace)).set_index("stream")
    assert s.loc["stream 7", "busy_ms"] == pytest.approx(0.15)
    assert s.loc["stream 9", ["kernels", "comm_kernels"]].tolist() == [3, 2]
    assert s.loc["stream 9", "busy_ms"] == pytest.approx(0.16)      # 130 + 20 + 10
    assert s.loc["stream 9", "comm_busy_ms"] == pytest.approx(0.15)


def test_the_report_names_families_and_gpu_figures(trace, capsys):
    assert main(["report", trace, "--format", "json", "--comm-kernels", "my_a2a"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpu"][0]["kernel_comm_ms"] == pytest.approx(0.18)
    assert {r["family"] for r in doc["comm_kernels"]} == {"DeepEP", "NCCL", "p2p memcpy", "--comm-kernels"}
    assert "gpu_exposed_comm_ms" in doc["definitions"]
    assert main(["report", trace]) == 0
    out = capsys.readouterr().out
    assert "comm kernels: rank 0 DeepEP 1 kernels 0.130 ms" in out and "streams:" in out


def test_no_comm_kernel_in_a_multi_rank_job_warns_never_a_silent_zero(tmp_path, capsys):
    path = tmp_path / "nocomm.json"
    path.write_text(json.dumps(kineto([("sm90_gemm", 7, 0, 100), ("fancy_alltoall", 8, 0, 50)], world=8)))
    lines = family_lines(load(str(path)))
    assert len(lines) == 1 and "world_size is 8" in lines[0] and "--comm-kernels" in lines[0]
    assert main(["report", str(path), "--format", "json"]) == 0
    assert "--comm-kernels" in json.loads(capsys.readouterr().out)["notes"][0]
    assert main(["report", str(path), "--comm-kernels", "alltoall"]) == 0
    assert "warning" not in capsys.readouterr().out
    path.write_text(json.dumps(kineto([("sm90_gemm", 7, 0, 100)], world=1)))
    assert family_lines(load(str(path))) == []


def test_htas_rule_comm_by_name_memory_neither_times_rounded_inward(tmp_path):
    def pct(kernels):
        path = tmp_path / "h.json"
        path.write_text(json.dumps(kineto(kernels)))
        return hta_overlap(load(str(path)))["comm_comp_overlap_pct"].iloc[0]
    # ^nccl.*Kernel is comm, whatever the families say: DeepEP is compute to HTA
    assert pct([("ncclDevKernel_AllGather", 9, 0, 100), ("dpsk::ep::combine", 7, 50, 100)]) == pytest.approx(50)
    assert pct([("ncclKernel_AllReduce", 9, 0, 100), ("my_nccl_helper", 7, 0, 25)]) == pytest.approx(25)
    # Memcpy / Memset are neither: they hide nothing
    assert pct([("ncclKernel_AllReduce", 9, 0, 100), ("Memcpy DtoD (Device -> Device)", 7, 0, 100, "gpu_memcpy"),
                ("Memset (Device)", 8, 0, 100, "gpu_memset")]) == 0
    # starts round up and ends down: comm [0.4, 10.6] -> [1, 10]; gemm [9.2, 20] -> [10, 20]: no overlap
    assert pct([("ncclKernel_AllReduce", 9, 0.4, 10.2), ("gemm", 7, 9.2, 10.8)]) == 0
    # ... where the exact times overlap by 1.4 of 10.2: partui's own figure keeps that
    path = tmp_path / "h.json"
    assert gpu_overlap(load(str(path)))["kernel_overlap_pct"].iloc[0] == pytest.approx(100 * 1.4 / 10.2)


def test_bad_inputs_exit_2_with_the_file_named(tmp_path, trace, capsys):
    whole = gzip.compress(json.dumps(kineto(KERNELS)).encode())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    assert main(["report", str(cut)]) == 2
    err = capsys.readouterr().err
    assert str(cut) in err and "truncated or corrupt" in err and "Traceback" not in err
    assert main(["report", trace, "--comm-kernels", "dispatch(["]) == 2
    err = capsys.readouterr().err
    assert "--comm-kernels 'dispatch(['" in err and "not a valid regular expression" in err
    with pytest.raises(TraceError, match="not a valid regular expression"):
        load(trace, comm_kernels=["*"])
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.json").write_text(json.dumps(kineto(KERNELS, world=2, rank=0)))
    (mixed / "b.json").write_text(json.dumps(kineto(KERNELS, world=4, rank=1)))
    assert main(["report", str(mixed)]) == 2
    err = capsys.readouterr().err
    assert "b.json" in err and "world_size 4" in err and "different jobs" in err
    (mixed / "b.json").write_text(json.dumps(kineto(KERNELS, world=2, rank=0)))
    assert main(["report", str(mixed)]) == 2
    assert "rank 0 again" in capsys.readouterr().err


def test_a_cpu_only_kineto_file_says_so_and_analyses_cpu_ops(tmp_path, capsys):
    cpu = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
           {"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": 50, "dur": 100}]
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(kineto([], cpu=cpu)))
    assert main(["report", str(path), "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert str(path) in captured.err and "no GPU kernels" in captured.err and "CPU ops" in captured.err
    row = json.loads(captured.out)["rows"][0]
    assert (row["compute_ms"], row["comm_ms"], row["overlapped_ms"]) == pytest.approx((0.1, 0.1, 0.05))


def test_the_kineto_bench_case_loads_and_reports_its_synthetic_trace():
    from partui.bench.analysis import bench_kineto, describe_kineto, synthetic_kineto
    doc = synthetic_kineto(2_000)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kernels) == 2_000 and len(doc["traceEvents"]) == 2 * 2_000 + 3 + 2
    res = bench_kineto(2_000)
    assert res["kernels"] == 2_000 and res["load_and_report_s"] > 0 and res["load_and_report_cpu_s"] > 0
    assert "2,000 kernels" in describe_kineto(res) and "goal under 5 s" in describe_kineto(res)
