"""Traces the analysis benchmark writes on the fly, tile by tile, never whole in memory: a
torch.profiler GPU trace of any size laid out as torch.profiler lays it out (pretty-printed, each
kernel with its launch and their args), and a real trace repeated end to end. A trace of k tiles
holds k copies of one tile's events shifted in time, so every additive figure of its report is k
times the one tile's: the check that a multi-GB read loses nothing."""
from __future__ import annotations

import gzip
import json
import os

import numpy as np

from partui.analysis import load, overlap_views
from partui.analysis.gpu.comm_kernels import family_table
from partui.analysis.gpu.gpu_steps import gpu_step_sums
from partui.analysis.figures.streams import gpu_overlap, stream_busy
from partui.recording.tracefile import write_atomic

HEAD = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85017755648}]}
STEPS_PER_TILE = 3


def kineto_tile(n_kernels: int, tile: int, span: float, seed: int = 0) -> list[dict]:
    """Tile `tile` of a GPU trace: n_kernels kernels (one in five NCCL, on its own stream), each
    with its cudaLaunchKernel, in STEPS_PER_TILE ProfilerSteps; the same draws in every tile,
    shifted by tile * span us, correlation and external ids by tile * n_kernels."""
    comm, ts, dur, launch = tile_draws(n_kernels, seed)
    shift, first = tile * span, tile * n_kernels
    names = np.where(comm, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "sm90_xmma_gemm_bf16bf16_bf16f32")
    evs = [{"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": s, "ts": t + shift, "dur": d,
            "args": {"External id": first + i, "device": 0, "stream": s, "correlation": first + i,
                     "registers per thread": 168, "shared memory": 213504, "blocks per SM": 1.0,
                     "warps per SM": 4.0, "grid": [132, 1, 1], "block": [384, 1, 1],
                     "est. achieved occupancy %": 6}}
           for i, (n, s, t, d) in enumerate(zip(names.tolist(), np.where(comm, 9, 7).tolist(),
                                                ts.tolist(), dur.tolist()))]
    evs += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + shift,
             "dur": 2.0, "args": {"External id": first + i, "cbid": 211, "correlation": first + i}}
            for i, t in enumerate(launch.tolist())]
    lo = min(launch.min(), ts.min())    # the steps cover the launches: a kernel is its launch's step's
    edges = np.linspace(lo, lo + span, STEPS_PER_TILE + 1) + shift
    evs += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{tile * STEPS_PER_TILE + k}",
             "pid": 1, "tid": 1, "ts": float(a), "dur": float(b - a)} for k, (a, b) in enumerate(zip(edges, edges[1:]))]
    return evs


def tile_draws(n_kernels: int, seed: int = 0):
    """(comm?, start, duration, launch time) of a tile's kernels, the same draws in every tile."""
    rng = np.random.default_rng(seed)
    comm = rng.random(n_kernels) < 0.2
    ts = np.cumsum(rng.uniform(1, 4, n_kernels)) + 100.0
    dur = np.where(comm, rng.uniform(5, 40, n_kernels), rng.uniform(0.5, 3, n_kernels))
    return comm, ts, dur, ts - rng.uniform(5, 50, n_kernels)


def tile_span(n_kernels: int, seed: int = 0) -> float:
    """A tile's length (us): its first launch (or kernel) to its last kernel's end (or launch's),
    so tiles follow each other with no overlap; every step's figures are its own kernels', so they
    add up over tiles."""
    _, ts, dur, launch = tile_draws(n_kernels, seed)
    return float(max((ts + dur).max(), launch.max() + 2.0) - min(launch.min(), ts.min()))


def write_tiles(path: str, n_kernels: int, tiles: int) -> int:
    """A torch.profiler trace of `tiles` tiles written tile by tile (pretty-printed as torch.profiler
    writes: one key per line group); its size in bytes."""
    import orjson
    span = tile_span(n_kernels)
    meta = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": s, "args": {"name": f"stream {s}"}} for s in (7, 9)]
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(json.dumps(HEAD, indent=2)[:-2].encode() + b',\n  "traceEvents": [\n')
        f.write(orjson.dumps(meta, option=orjson.OPT_INDENT_2)[1:-2])
        for t in range(tiles):
            f.write(b",")
            f.write(orjson.dumps(kineto_tile(n_kernels, t, span), option=orjson.OPT_INDENT_2)[1:-2])
        f.write(b'\n  ],\n  "traceName": "partui bench analysis"\n}\n')
    os.replace(tmp, path)
    return os.path.getsize(path)


def report_figures(df) -> dict:
    """The additive figures of a GPU trace's report (each k times one tile's in a k-tile trace)."""
    sums = gpu_step_sums(df)  # once, as partui report does
    by_rank = overlap_views(df, ("rank",), sums)["rank"]
    fam = family_table(df)
    gpu = gpu_overlap(df, sums)
    busy = stream_busy(df, sums)
    pick = lambda frame, cols: {c: float(frame[c].sum()) for c in cols if c in frame}  # noqa: E731
    out = pick(by_rank, [c for c in by_rank.columns if c.endswith("_ms")])
    out.update({f"family {k}": v for k, v in pick(fam, ["kernels", "kernel_ms"]).items()})
    out.update({f"gpu {k}": v for k, v in pick(gpu, [c for c in gpu.columns if c.endswith("_ms")]).items()})
    out.update({f"streams {k}": v for k, v in pick(busy, [c for c in busy.columns if c.endswith("_ms")]).items()})
    return out


def scaled_mismatch(big: dict, small: dict, k: int, rel: float = 1e-6) -> list[str]:
    """The figures of the k-tile trace that are not k times the tile's (time shifts round: rel)."""
    bad = []
    for name, v in small.items():
        want, got = v * k, big.get(name, float("nan"))
        if not abs(got - want) <= rel * max(abs(want), 1.0):
            bad.append(f"{name}: {got:.6g}, not {k} x {v:.6g}")
    return bad


def repeat_trace(src: str, dst: str, times: int) -> str:
    """A real trace (partui or torch.profiler) repeated `times` times end to end: each copy's events
    shifted past the one before, its correlation / External ids past the copy before's."""
    with (gzip.open if src.endswith(".gz") else open)(src, "rb") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    times_us = [e["ts"] + e.get("dur", 0) for e in events if isinstance(e.get("ts"), (int, float))]
    starts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(times_us) - min(starts) + 1000.0
    ids = [e["args"][k] for e in events for k in ("correlation", "External id")
           if isinstance(e.get("args"), dict) and isinstance(e["args"].get(k), int)]
    id_step = max(ids, default=0) + 1
    out = []
    for t in range(times):
        for e in events:
            e2 = dict(e)
            if isinstance(e2.get("ts"), (int, float)) and e2.get("ph") != "M":
                e2["ts"] = e2["ts"] + t * span
            if isinstance(e2.get("args"), dict):
                args = dict(e2["args"])
                for k in ("correlation", "External id"):
                    if isinstance(args.get(k), int):
                        args[k] += t * id_step
                e2["args"] = args
            if e2.get("ph") == "M" and t:
                continue  # thread names once
            out.append(e2)
    write_atomic(dst, dict(doc, traceEvents=out))
    return dst


def load_report(path: str) -> dict:
    """Load a GPU trace and run the report's figures (the measured work of the kineto cases)."""
    df = load(path, progress=False)
    return report_figures(df)
