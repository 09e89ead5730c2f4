"""Hand-built torch.profiler GPU traces for the pandas-free report's tests: every shape the GPU report
reads (steps or none, one step, kernels no launch claims, memcpys and memsets, comm families, unnamed
streams, a ProfilerStep copy on the GPU track, launches outside every step), ranks as files of a directory."""
import json
import os

import numpy as np

NAMES = [("kernel", "sm90_xmma_gemm_bf16"), ("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"),
         ("kernel", "ampere_sgemm_128x64"), ("gpu_memcpy", "Memcpy DtoD (Device -> Device)"),
         ("gpu_memset", "Memset (Device)"), ("kernel", "void dpsk::ep::internode::dispatch<8>"),
         ("kernel", "my_a2a_kernel"), ("gpu_memcpy", "Memcpy PtoP (Device -> Device)")]


def gpu_doc(rank: int = 0, world: int = 2, steps: int = 3, n: int = 60, seed: int = 0, comm: bool = True,
            orphans: int = 2, names: bool = True) -> dict:
    """A rank's trace: `steps` ProfilerSteps of 1000 us (0: none), n kernels on streams 7 / 13 / 21 (21
    unnamed) launched at random inside them (some before the first), each running 0..1500 us late, so
    kernels cross step windows; `orphans` kernels no CPU call claims."""
    rng = np.random.default_rng(seed + 100 * rank)
    ev = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": s, "args": {"name": f"stream {s} "}} for s in (7, 13)]
    ev += [{"ph": "M", "name": "process_name", "pid": "Spans", "tid": 0, "args": {"name": "spans"}}]
    for k in range(steps):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k + 5}", "pid": 1, "tid": 1,
                   "ts": 1000.0 * k + 0.25, "dur": 999.5})
        ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{k + 5}", "pid": 0, "tid": 7,
                   "ts": 1000.0 * k + 300, "dur": 900})
    usable = [i for i, (_, nm) in enumerate(NAMES) if comm or not any(
        w in nm for w in ("nccl", "dpsk", "PtoP"))]
    for i in range(n):
        cat, name = NAMES[int(rng.choice(usable))]
        launch = float(np.round(rng.uniform(-200, 1000.0 * max(steps, 1)), 3))
        ts = launch + float(np.round(rng.uniform(1, 1500), 3))
        dur = float(np.round(rng.uniform(0.2, 300), 3))
        stream = int(rng.choice([7, 13, 21])) if not name.startswith("ncclDev") else 13
        corr = 1000 + i
        if i >= orphans:
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": launch, "dur": 3.5, "args": {"correlation": corr, "External id": i}})
        ev.append({"ph": "X", "cat": cat, "name": name if names else f"k{i}", "pid": 0, "tid": stream, "ts": ts,
                   "dur": dur, "args": {"correlation": corr, "stream": stream, "device": 0}})
    ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0})
    ev.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 0, "tid": 7, "ts": 12.0})
    ev.reverse()   # file order is not time order
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "traceEvents": ev}


def write(path, doc) -> str:
    with open(path, "w") as f:
        json.dump(doc, f)
    return str(path)


def rank_folder(folder, world: int = 3, **kw) -> str:
    os.makedirs(folder, exist_ok=True)
    for r in range(world):
        write(os.path.join(folder, f"rank-{r}.json"), gpu_doc(rank=r, world=world, **kw))
    return str(folder)


def cpu_doc() -> dict:
    """A CPU-only torch.profiler trace (gloo): aten ops compute, a gloo all-reduce in flight."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 40},
          {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": 30, "dur": 50}]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2},
            "traceEvents": ev}


PART_ORDER = ["attn(F)", "dispatch(F)", "mlp(F)", "combine(F)", "mlp(B)", "combine(B)", "attn(B)", "mlp(W)",
              "dispatch(B)", "attn(W)"]
A2A_KERNEL = "void dpsk::ep::internode::dispatch<8>"


def parts_doc(rank: int = 0, world: int = 2, layers: int = 3, seed: int = 0) -> dict:
    """A rank's trace of F&B pair parts (annotations named as pair_parts.PART_NAMES): one ProfilerStep
    holding a "DualPipe" annotation holding a "1F1B" one, which holds `layers` layers of PART_ORDER's
    parts one after the other on the CPU; each part launches 1..3 kernels (from thread 1 or 2, as autograd
    does), the all-to-all parts DeepEP comm kernels, the others gemms, on two streams at random GPU times,
    so all-to-alls fly under other parts' compute or alone. Also a kernel launched outside every part, one
    no call claims, a zero-length one, and a part after 1F1B ends (held by DualPipe alone)."""
    rng = np.random.default_rng(seed + 100 * rank)
    ev = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": s, "args": {"name": f"stream {s}"}} for s in (7, 13)]
    t, corr = 100.0, 1
    annotations = []

    def kernel(name, launch_at, tid, ts, dur, stream, claimed=True):
        nonlocal corr
        if claimed:
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid,
                       "ts": launch_at, "dur": 2.0, "args": {"correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                   "args": {"correlation": corr, "stream": stream}})
        corr += 1
    for k in range(layers):
        for name in PART_ORDER:
            dur = float(np.round(rng.uniform(20, 60), 3))
            annotations.append((name, t, dur))
            for _ in range(int(rng.integers(1, 4))):
                a2a = name.startswith(("dispatch", "combine"))
                kernel(A2A_KERNEL if a2a else "sm90_xmma_gemm_bf16", float(np.round(t + rng.uniform(0, dur), 3)),
                       int(rng.choice([1, 2])), float(np.round(rng.uniform(1000, 1000 + 120 * layers * 10), 3)),
                       float(np.round(rng.uniform(5, 300), 3)), 13 if a2a else 7)
            t += dur + 5
    first_end = t
    annotations.append(("attn(F)", t + 10, 30.0))   # after 1F1B: its pair is DualPipe
    kernel("sm90_xmma_gemm_bf16", t + 20, 1, 5000.0, 40.0, 7)
    kernel("sm90_xmma_gemm_bf16", t + 100, 1, 1100.0, 90.0, 7)           # outside every part
    kernel("sm90_xmma_gemm_bf16", 0, 1, 1200.0, 70.0, 7, claimed=False)   # no call claims it
    kernel(A2A_KERNEL, 150.0, 1, 1300.0, 0.0, 13)                        # zero length: never counted
    ev += [{"ph": "X", "cat": "user_annotation", "name": n, "pid": 1, "tid": 1, "ts": a, "dur": d}
           for n, a, d in annotations]
    ev.append({"ph": "X", "cat": "user_annotation", "name": "1F1B", "pid": 1, "tid": 1, "ts": 95.0,
               "dur": first_end - 95.0})
    ev.append({"ph": "X", "cat": "user_annotation", "name": "DualPipe", "pid": 1, "tid": 1, "ts": 90.0,
               "dur": t + 200 - 90.0})
    ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 50.0,
               "dur": t + 400})
    ev.reverse()   # file order is not time order
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "traceEvents": ev}
