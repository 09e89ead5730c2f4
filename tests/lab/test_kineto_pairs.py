"""F&B pair parts of a torch.profiler trace from its annotations (`partui report --by pair`), tied to their
kernels by launch correlation, on a hand-built trace with known answers."""
import gzip
import json
import re
from pathlib import Path

import pytest

from conftest import ROOT

from partui.analysis import load
from partui.analysis.figures.kineto_pairs import kineto_pairs
from partui.analysis.gpu.pair_parts import PART_NAMES
from partui.cli import main


def annotated_trace() -> dict:
    """1F1B [0,40] holds attn(F) [0,10], dispatch(F) [10,20], mlp(B) [20,30]; each launches one kernel (attn(F)'s
    from another thread, as autograd does): gemm [100,150], DeepEP dispatch [150,250], gemm [160,200]."""
    ann = [("1F1B", 0, 40), ("attn(F)", 0, 10), ("dispatch(F)", 10, 20), ("mlp(B)", 20, 30)]
    ev = [{"ph": "X", "cat": "user_annotation", "name": n, "pid": 1, "tid": 1, "ts": t, "dur": e - t}
          for n, t, e in ann]
    kernels = [(2, 5, "sm90_gemm", 100, 50), (1, 12, "void dpsk::ep::internode::dispatch<false>(int4*)", 150, 100),
               (1, 22, "sm90_gemm", 160, 40)]
    for corr, (tid, launch, name, ts, dur) in enumerate(kernels, start=1):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid,
                   "ts": launch, "dur": 1, "args": {"correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7 if corr != 2 else 9, "ts": ts,
                   "dur": dur, "args": {"correlation": corr, "stream": 7 if corr != 2 else 9}})
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": ev}


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "parts.json"
    path.write_text(json.dumps(annotated_trace()))
    return str(path)


def test_parts_get_their_kernels_and_the_all_to_all_what_flew_under(trace):
    t = kineto_pairs(load(trace)).set_index("annotation")
    assert t.loc["attn(F)", ["part", "launched", "gpu_ms", "a2a_ms"]].tolist() == ["ATTN", 1, pytest.approx(0.05), 0]
    d = t.loc["dispatch(F)"]
    assert (d["part"], d["pair"], d["layer_k"], d["under"]) == ("DISPATCH", "1F1B", 0, "mlp(B) L0")
    # dispatch [150,250]; mlp(B)'s gemm [160,200] under it (attn(F)'s gemm ends at 150): 40 of 100
    assert (d["a2a_ms"], d["a2a_under_ms"], d["a2a_exposed_ms"]) == pytest.approx((0.1, 0.04, 0.06))


def test_the_cli_reads_the_parts_and_the_names_are_data(trace, capsys, monkeypatch):
    assert main(["report", trace, "--by", "pair"]) == 0
    out = capsys.readouterr().out
    assert "dispatch(F)" in out and "F&B parts: 3 annotations over 1 layers" in out
    # another framework's names: a row of data, no code
    doc = annotated_trace()
    for e in doc["traceEvents"]:
        e["name"] = {"attn(F)": "fwd_attention", "dispatch(F)": "fwd_a2a_dispatch"}.get(e["name"], e["name"])
    path = trace.replace("parts.json", "other.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    monkeypatch.setattr("partui.analysis.gpu.pair_parts.PART_NAMES",
                        PART_NAMES + [(r"^fwd_(?:attention)$(?P<side>)", "ATTN"),
                                      (r"^fwd_a2a_dispatch$(?P<side>)", "DISPATCH")])
    t = kineto_pairs(load(path)).set_index("annotation")
    assert t.loc["fwd_a2a_dispatch", "a2a_exposed_ms"] == pytest.approx(0.06)


def serial_parts_trace() -> dict:
    """One layer's parts one after the other, each launching one kernel that runs alone for a known time
    (us): attn(F) 10, dispatch(F) 20 (DeepEP), mlp(F) 30, mlp(B) 50, attn(B) 40, mlp(W) 6, attn(W) 5."""
    parts = [("attn(F)", "gemm", 10), ("dispatch(F)", "dpsk::ep::dispatch", 20), ("mlp(F)", "gemm", 30),
             ("mlp(B)", "gemm", 50), ("attn(B)", "gemm", 40), ("mlp(W)", "gemm", 6), ("attn(W)", "gemm", 5)]
    ev, gpu_t = [], 1000
    for i, (name, kernel, dur) in enumerate(parts, start=1):
        ev.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                   "ts": 10 * i + 1, "dur": 1, "args": {"correlation": i}})
        ev.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": gpu_t, "dur": dur,
                   "args": {"correlation": i, "stream": 7}})
        gpu_t += dur
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 2}, "traceEvents": ev}


def test_simulate_plans_the_traces_measured_parts_beside_the_recorded_pair(tmp_path, capsys):
    from planning.pipeline.part_costs import PartCost, pair_timeline
    path = tmp_path / "serial.json"
    path.write_text(json.dumps(serial_parts_trace()))
    args = ["simulate", "--schedule", "1f1b", "--pp", "2", "--microbatches", "2", "--parts", str(path), "--fb-overlap"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert ("ATTN=0.010 MLP=0.030 ATTN_B=0.040 MLP_B=0.050 ATTN_W=0.005 MLP_W=0.006; all-to-alls "
            "dispatch(F)=0.020 combine(F)=0.020 combine(B)=0.020 dispatch(B)=0.020 (mean A2A=0.020)") in out
    plan = pair_timeline(PartCost(ATTN=0.01, MLP=0.03, COMBINE=0, A2A=0.02, ATTN_B=0.04, MLP_B=0.05,
                                  ATTN_W=0.005, MLP_W=0.006, A2A_DISPATCH_F=0.02, layers=1))
    assert f"planner's order, measured costs: {plan.makespan:.3f} ms (all-to-all exposed {plan.exposed_comm:.3f} ms)" in out
    # the recorded order replayed by hand on two streams (a missing all-to-all costs the mean, 0.02):
    # F ATTN [0,10] -> dispatch(F) [10,30]; F MLP [30,60] -> combine(F) [60,80]; B MLP [60,110] -> dispatch(B)
    # [110,130]; B ATTN waits it [130,170]; MLP_W, ATTN_W to 181; F COMBINE (0) last. Exposed: [10,30], [110,130]
    assert "recorded order, same model:      0.181 ms (all-to-all exposed 0.040 ms)" in out
    assert "recorded pair:                   0.161 ms (the parts' GPU window" in out
    assert "recorded W parts: B ATTN_W after B MLP_W, B MLP_W after B ATTN" in out
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 0, "dur": 5, "args": {"stream": 7}}]}
    path.write_text(json.dumps(doc))
    assert main(args) == 2
    assert "no part annotations" in capsys.readouterr().err


@pytest.mark.parametrize("cat, api", [("cuda_driver", "cuLaunchKernel"), ("cuda_runtime", "cudaLaunchKernelExC"),
                                      ("cuda_runtime", "cudaGraphLaunch"), ("cuda_runtime", "hipModuleLaunchKernel")])
def test_a_kernel_launched_through_any_api_belongs_to_its_part(tmp_path, cat, api):
    """attn(F) launches its gemm through `api`: the part owns it all the same (1 kernel, 0.05 ms)."""
    doc = annotated_trace()
    for e in doc["traceEvents"]:
        if e.get("args", {}).get("correlation") == 1 and e["cat"] == "cuda_runtime":
            e["cat"], e["name"] = cat, api
    path = tmp_path / "driver.json"
    path.write_text(json.dumps(doc))
    t = kineto_pairs(load(str(path))).set_index("annotation")
    assert t.loc["attn(F)", ["launched", "gpu_ms"]].tolist() == [1, pytest.approx(0.05)]


DEEPSEEK = Path(ROOT).parent / "shared" / "real-traces" / "deepseek-profile-data" / "train.json.gz"


@pytest.mark.skipif(not DEEPSEEK.exists(), reason="../shared/real-traces is absent (the real traces live beside "
                                                  "the checkout, never in it)")
def test_every_kernel_of_every_part_of_deepseeks_pair_is_counted():
    """Counted apart from the report's code: each GPU kernel whose launching call (any CPU event with its
    correlation id, runtime or driver) starts inside a part annotation on that thread's process is that
    part's. DeepSeek's trace launches 40 of them with cuLaunchKernel."""
    with gzip.open(DEEPSEEK, "rt") as f:
        events = json.load(f)["traceEvents"]
    parts = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                   if e.get("cat") == "user_annotation" and re.match(r"^(attn|mlp|dispatch|combine)\([FBW]\)$", e["name"]))
    kernels = {e["args"]["correlation"] for e in events if e.get("cat") == "kernel" and "correlation" in e.get("args", {})}
    want, drivers = {}, 0
    for e in events:
        corr = e.get("args", {}).get("correlation")
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and corr in kernels:
            inside = [name for a, b, name in parts if a <= e["ts"] <= b]
            if inside:
                want[inside[0]] = want.get(inside[0], 0) + 1
                drivers += e["cat"] == "cuda_driver"
    got = kineto_pairs(load(str(DEEPSEEK))).groupby("annotation")["launched"].sum().to_dict()
    assert got == want
    assert drivers == 40
