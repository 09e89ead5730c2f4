"""The analysis benchmark: a synthetic partui trace of about n events, written, loaded and analysed
(per rank, per step, per op), with wall and CPU seconds per phase and peak memory (`partui bench
trace` runs it too); and a synthetic torch.profiler (Kineto) GPU trace of n kernels, loaded and
reported as `partui report` does for a GPU trace (overlap, GPU-side figures, streams, families, HTA's).

    partui bench analysis 1000000                # every case, each in its own process, beside its goal
    partui bench analysis 1000000 --big-gb 0     # without the multi-GB trace
    partui bench analysis --kineto 1000000       # the Kineto case alone, in this process
    partui bench analysis --hta-python DIR/bin/python   # report vs HTA, HTA in its own venv (analysis_torch)

The cases: the partui trace (load and analyse; then again from its parquet cache), the torch.profiler
trace, a multi-GB torch.profiler trace written tile by tile (its figures checked against one tile's,
scaled), `partui report` on a real trace whole-process (against HTA's when HTA is installed),
`report --by pair` on DeepSeek's trace repeated 25 times, and `partui bench blame-scale` where it exists.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from partui.analysis import hta_overlap, load, overlap_views
from partui.analysis.gpu.comm_kernels import family_table
from partui.analysis.gpu.gpu_steps import gpu_step_sums
from partui.analysis.figures.streams import gpu_overlap, stream_busy
from partui.bench.analysis_scale import repeat_trace, report_figures, scaled_mismatch, write_tiles
from partui.bench.analysis_torch import HTA_ENV, describe_vs_hta, find_hta_python, hta_python_arg, \
    report_vs_hta
from partui.recording.tracefile import FORMAT, write_atomic
from planning.pipeline.catalog import DEFAULT_SCHEDULE

REAL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "real-traces", "hta-tests",
                    "nccl_data.json.gz")  # HTA's own test trace, one rank of a real NCCL job


def synthetic_trace(n_events: int, ranks: int = 8, seed: int = 0) -> dict:
    """A partui-format trace of about n_events slices: an 8-stage pipeline's steps of F / B action
    spans (thread CPU time recorded, every tenth a wait nested inside) with async comm, so every
    figure of the report is computed: overlap, waits, pipeline window, theory, core sharing."""
    rng = np.random.default_rng(seed)
    per_rank = max(n_events // ranks, 4)
    n_comm = per_rank // 4
    n_comp = per_rank - n_comm
    evs = []
    for r in range(ranks):  # a loop per rank; each rank's events are built from arrays
        t = np.cumsum(rng.uniform(5, 15, n_comp))
        d = rng.uniform(2, 6, n_comp)
        ct = rng.choice(t, n_comm)
        cd = rng.uniform(1, 30, n_comm)
        steps = np.minimum((np.arange(n_comp) * 10) // n_comp, 9)
        cats = np.where(np.arange(n_comp) % 2 == 0, "F", "B")
        evs += [{"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": name}}
                for tid, name in ((1, "compute"), (2, "comm"))]
        evs += [{"ph": "X", "name": c, "cat": c, "pid": r, "tid": 1, "ts": float(a), "dur": float(b),
                 "args": {"step": int(s), "mb": 0, "chunk": 0, "cpu_us": float(b) * 0.8}}
                for a, b, c, s in zip(t, d, cats, steps)]
        evs += [{"ph": "X", "name": "wait all_reduce", "cat": "wait", "pid": r, "tid": 1,
                 "ts": float(a) + 0.5, "dur": 1.0, "args": {"op": "all_reduce"}}
                for a in t[::10]]
        evs += [{"ph": "X", "name": "all_reduce", "cat": "comm", "pid": r, "tid": 2, "ts": float(a),
                 "dur": float(b), "args": {"op": "all_reduce", "group": "dp", "bytes": 4096}}
                for a, b in zip(ct, cd)]
        bounds = np.searchsorted(steps, np.arange(11))
        for s in range(10):
            if bounds[s + 1] > bounds[s]:
                t0, t1 = t[bounds[s]], t[bounds[s + 1] - 1] + d[bounds[s + 1] - 1]
                evs.append({"ph": "X", "name": "step", "cat": "step", "pid": r, "tid": 1,
                            "ts": float(t0) - 1, "dur": float(t1 - t0) + 2, "args": {"step": s}})
    return {"traceEvents": evs, "displayTimeUnit": "ms",
            "metadata": {"format": FORMAT, "synthetic": True,
                         "plan": {"pp": ranks, "schedule": DEFAULT_SCHEDULE, "microbatches": 2 * ranks},
                         "coords": {str(r): f"pp{r}" for r in range(ranks)}}}


def bench_analysis(n_events: int = 1_000_000, path: str | None = None) -> dict:
    """Generate, write, load and analyse a synthetic trace; seconds per phase and peak memory."""
    t0 = time.perf_counter()
    doc = synthetic_trace(n_events)
    n = len(doc["traceEvents"])
    tmp = None
    if path is None:
        tmp = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
        tmp.close()
        path = tmp.name
    try:
        t1 = time.perf_counter()
        write_atomic(path, doc)
        del doc
        t2, c2 = time.perf_counter(), time.process_time()
        df = load(path)
        t3, c3 = time.perf_counter(), time.process_time()
        views = overlap_views(df)  # per rank, per step, per op; shared work once
        by_rank, by_step, by_op = views["rank"], views["step"], views["op"]
        t4, c4 = time.perf_counter(), time.process_time()
        size = os.path.getsize(path)
    finally:
        if tmp is not None:
            os.unlink(path)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    return {"events": n, "file_mb": size / 2**20, "generate_s": t1 - t0, "write_s": t2 - t1,
            "load_s": t3 - t2, "analyse_s": t4 - t3, "load_and_analyse_s": t4 - t2,
            "load_cpu_s": c3 - c2, "analyse_cpu_s": c4 - c3, "load_and_analyse_cpu_s": c4 - c2,
            "peak_rss_mb": peak_kb / 1024, "rows": [len(by_rank), len(by_step), len(by_op)]}


def describe(res: dict) -> str:
    """The benchmark's figures, each saying what it counts."""
    return "\n".join([
        f"analysis of a synthetic partui trace: {res['events']:,} events ({res['file_mb']:.0f} MB of JSON; "
        f"8 pipeline ranks, F / B actions with CPU times, waits, async comm, step spans)",
        f"  load (decode + the analysis table): {res['load_s']:.2f} s wall, {res['load_cpu_s']:.2f} s CPU",
        f"  analyse (overlap per rank, per step, per op; pipeline windows, simulator, core sharing): "
        f"{res['analyse_s']:.2f} s wall, {res['analyse_cpu_s']:.2f} s CPU",
        f"  load and analyse: {res['load_and_analyse_s']:.2f} s wall, {res['load_and_analyse_cpu_s']:.2f} s CPU "
        f"(target under 9 s, goal 5 s, quiet machine)",
        f"  peak RSS of this process: {res['peak_rss_mb']:.0f} MB (generating the trace included)"])


def synthetic_kineto(n_kernels: int, seed: int = 0) -> dict:
    """A torch.profiler GPU trace of one rank (of 8) with n_kernels kernels: a compute stream and an NCCL
    stream (one kernel in five), each launched by a cudaLaunchKernel on the CPU (correlation ids), inside
    three ProfilerSteps: every figure of a GPU report is computed, HTA's filter included."""
    rng = np.random.default_rng(seed)
    comm = rng.random(n_kernels) < 0.2
    ts = np.cumsum(rng.uniform(1, 4, n_kernels))
    dur = np.where(comm, rng.uniform(5, 40, n_kernels), rng.uniform(0.5, 3, n_kernels))
    launch = ts - rng.uniform(5, 50, n_kernels)
    names = np.where(comm, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "sm90_xmma_gemm_bf16")
    streams = np.where(comm, 9, 7)
    evs = [{"ph": "M", "name": "thread_name", "pid": 0, "tid": int(s), "args": {"name": f"stream {s}"}} for s in (7, 9)]
    evs += [{"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": int(s), "ts": float(t), "dur": float(d),
             "args": {"stream": int(s), "correlation": i, "device": 0}}
            for i, (n, s, t, d) in enumerate(zip(names.tolist(), streams.tolist(), ts.tolist(), dur.tolist()))]
    evs += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": float(t),
             "dur": 2.0, "args": {"correlation": i}} for i, t in enumerate(launch.tolist())]
    edges = np.linspace(launch.min() - 1, ts.max() + 1, 4)
    evs += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 1, "tid": 1,
             "ts": float(a), "dur": float(b - a)} for k, (a, b) in enumerate(zip(edges, edges[1:]))]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
            "traceEvents": evs}


def bench_kineto(n_kernels: int = 1_000_000) -> dict:
    """Write, load and report a synthetic Kineto trace: seconds per phase."""
    doc = synthetic_kineto(n_kernels)
    n = len(doc["traceEvents"])
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "rank0.json")
        write_atomic(path, doc)
        del doc
        size = os.path.getsize(path)
        t0, c0 = time.perf_counter(), time.process_time()
        df = load(path)
        t1, c1 = time.perf_counter(), time.process_time()
        sums = gpu_step_sums(df)  # once, as partui report does
        overlap_views(df, ("rank", "op"), sums)
        gpu_overlap(df, sums), stream_busy(df, sums), family_table(df), hta_overlap(df)
        t2, c2 = time.perf_counter(), time.process_time()
    return {"kernels": n_kernels, "events": n, "file_mb": size / 2**20, "load_s": t1 - t0, "report_s": t2 - t1,
            "load_and_report_s": t2 - t0, "load_and_report_cpu_s": c2 - c0}


def describe_kineto(res: dict) -> str:
    return "\n".join([
        f"a synthetic torch.profiler GPU trace: {res['kernels']:,} kernels, {res['events']:,} events with their "
        f"launches ({res['file_mb']:.0f} MB of JSON; a compute and an NCCL stream, 3 ProfilerSteps)",
        f"  load: {res['load_s']:.2f} s wall; report (overlap per rank and op, GPU-side figures, streams, comm "
        f"families, HTA's overlap): {res['report_s']:.2f} s wall",
        f"  load and report: {res['load_and_report_s']:.2f} s wall, {res['load_and_report_cpu_s']:.2f} s CPU "
        f"(goal under 5 s, quiet machine)"])


GOALS = {"partui": (5.0, 800), "kineto": (5.0, None), "big": (None, 1536), "report/hta": 0.25, "pairs": 2.0,
         "blame-scale": 20.0}  # wall s, peak RSS MB (issue 36's done-when, a quiet 2-core machine)


def child(argv: list[str], env: dict | None = None, ok=(0,)) -> tuple[dict, float, float]:
    """Run `python ARGV` as its own process: (its last stdout line as JSON, or {}, with `process_cpu_s`
    (user + system seconds of the whole process); its wall seconds; its peak RSS in MB, from the
    kernel's accounting of that process alone). ok: the exit codes that are answers, not failures."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, *argv], stdout=out, stderr=err, env=dict(os.environ, **(env or {})))
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (communicate would reap it first)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0), err.seek(0)
        out, err = out.read(), err.read()
    rss = usage.ru_maxrss / 1024  # Linux: KiB
    cpu = usage.ru_utime + usage.ru_stime
    if proc.returncode not in ok:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {err.decode()[-2000:]}")
    lines = out.decode().strip().splitlines()
    try:
        got = json.loads(lines[-1]) if lines else {}
    except ValueError:
        got = {"output": out.decode()}
    got = got if isinstance(got, dict) else {"output": out.decode()}
    return dict(got, process_cpu_s=cpu), wall, rss


def one_case(case: str, path: str) -> dict:
    """In a child process: load and analyse one trace, timed in-process (wall, CPU)."""
    t0, c0 = time.perf_counter(), time.process_time()
    df = load(path, progress=False)
    t1, c1 = time.perf_counter(), time.process_time()
    out = {"events": len(df), "load_s": t1 - t0}
    if case == "partui":
        views = overlap_views(df)
        out["rows"] = [len(views[v]) for v in ("rank", "step", "op")]
    else:
        out["figures"] = report_figures(df)
        hta_overlap(df)
    t2, c2 = time.perf_counter(), time.process_time()
    out.update(wall_s=t2 - t0, cpu_s=c2 - c0)
    return out


def beside(wall: float, rss: float, goal: tuple) -> str:
    s, mb = goal
    return (f"{wall:.2f} s wall" + (f" (goal <= {s:g} s)" if s else "") + f", peak RSS {rss:.0f} MB"
            + (f" (goal <= {mb} MB)" if mb else ""))


def run_all(n: int, big_gb: float, real: str | None, folder: str, hta_python: str | None = None) -> None:
    """Every case, each in its own process, each figure beside its goal (see module doc)."""
    me = ["-m", "partui.bench.analysis", "--case"]
    cold = {"PARTUI_TRACE_CACHE": "0"}
    write = ["-m", "partui.bench.analysis", "--write"]  # in a child: this process stays small, and
    # a child's peak RSS starts at its parent's (Linux keeps the high-water mark across fork and exec)
    path = os.path.join(folder, "partui.json")
    child(write + ["partui", path, str(n)])
    got, _, rss = child(me + ["partui", path], cold)
    print(f"partui trace, {got['events']:,} slices ({os.path.getsize(path) / 2**20:.0f} MB): load "
          f"{got['load_s']:.2f} s; load and analyse (per rank, step, op) {got['cpu_s']:.2f} s CPU, "
          + beside(got["wall_s"], rss, GOALS["partui"]))
    child(me + ["partui", path])  # writes the cache
    got, _, rss = child(me + ["partui", path])
    print(f"  again, from its parquet cache: {got['load_s']:.2f} s load, " + beside(got["wall_s"], rss, (None, None)))
    path = os.path.join(folder, "kineto.json")
    child(write + ["kineto", path, str(n)])
    got, _, rss = child(me + ["kineto", path], cold)
    print(f"torch.profiler trace, {n:,} kernels ({os.path.getsize(path) / 2**20:.0f} MB): load {got['load_s']:.2f} s; "
          f"load and report {got['cpu_s']:.2f} s CPU, " + beside(got["wall_s"], rss, GOALS["kineto"]))
    os.unlink(path)
    if big_gb > 0:
        tile = 100_000
        one = os.path.join(folder, "tile.json")
        child(write + ["tiles", one, f"{tile}x1"])
        tiles = max(int(big_gb * 2**30 // os.path.getsize(one)), 1)
        big = os.path.join(folder, "big.json")
        t0 = time.perf_counter()
        child(write + ["tiles", big, f"{tile}x{tiles}"])
        size, wrote = os.path.getsize(big), time.perf_counter() - t0
        small, _, _ = child(me + ["kineto", one], cold)
        got, _, rss = child(me + ["kineto", big], cold)
        bad = scaled_mismatch(got["figures"], small["figures"], tiles)
        print(f"torch.profiler trace of {size / 2**30:.2f} GB ({tiles} x {tile:,} kernels, pretty-printed; written "
              f"in {wrote:.0f} s): load {got['load_s']:.1f} s, load and report " + beside(got["wall_s"], rss, GOALS["big"]))
        print(f"  its {len(small['figures'])} additive report figures equal {tiles} x one tile's: "
              + ("yes" if not bad else "NO: " + "; ".join(bad[:3])))
        os.unlink(big)
    if real:
        cases(real, folder, hta_python)


def cases(real: str, folder: str, hta_python: str | None = None) -> None:
    """`partui report` whole process on a real trace (beside HTA's, when installed), `--by pair` on
    DeepSeek's trace repeated 25 times, and `partui bench blame-scale` when that bench exists."""
    print(describe_vs_hta(real, report_vs_hta(real, folder, hta_python)))  # analysis_torch
    deepseek = os.path.join(os.path.dirname(os.path.dirname(real.rstrip("/"))), "deepseek-profile-data", "train.json.gz")
    if os.path.isfile(deepseek):
        tiled = os.path.join(folder, "pairs25.json")   # written by a child: this process stays small
        child(["-m", "partui.bench.analysis", "--write", f"repeat={deepseek}", tiled, "25"])
        got, wall, rss = child(["-m", "partui", "report", tiled, "--by", "pair", "--format", "json"],
                               {"PARTUI_TRACE_CACHE": "0"})
        print(f"partui report --by pair, DeepSeek's trace x 25 (whole process): {wall:.2f} s wall "
              f"(goal <= {GOALS['pairs']} s), {got['process_cpu_s']:.2f} s CPU, peak RSS {rss:.0f} MB")
    got, wall, rss = child(["-m", "partui", "bench", "blame-scale"], ok=(0, 1))  # 1: over its goal, said in its table
    print(f"partui bench blame-scale (whole process): {wall:.1f} s wall (goal <= {GOALS['blame-scale']} s), "
          f"{got['process_cpu_s']:.1f} s CPU, peak RSS {rss:.0f} MB\n  " + str(got.get("output", "")).strip().replace("\n", "\n  "))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="partui bench analysis", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("events", nargs="?", default="1000000", help="events of the partui trace, kernels of the Kineto one")
    ap.add_argument("--kineto", action="store_true", help="the Kineto case alone, in this process")
    ap.add_argument("--big-gb", type=float, default=3.0, help="size of the torch.profiler trace written on the "
                    "fly (GB; 0: none)")
    ap.add_argument("--real", default=REAL if os.path.isfile(REAL) else None,
                    help="a real torch.profiler trace file for report vs HTA (default: HTA's nccl_data test trace)")
    ap.add_argument("--hta-python", type=hta_python_arg, metavar="PATH", help="a python that imports hta, for "
                    f"report vs HTA (default: ${HTA_ENV}, else this python when it has HTA)")
    ap.add_argument("--case", nargs=2, metavar=("CASE", "PATH"), help=argparse.SUPPRESS)  # one child's work
    ap.add_argument("--write", nargs=3, metavar=("KIND", "PATH", "N"), help=argparse.SUPPRESS)  # a child's trace
    args = ap.parse_args(argv)
    if args.case:
        print(json.dumps(one_case(*args.case)))
        return 0
    if args.write:
        kind, path, size = args.write
        if kind == "tiles":
            write_tiles(path, *map(int, size.split("x")))
        elif kind.startswith("repeat="):   # a real trace repeated N times
            repeat_trace(kind.split("=", 1)[1], path, int(size))
        else:
            write_atomic(path, (synthetic_trace if kind == "partui" else synthetic_kineto)(int(size)))
        return 0
    n = int(args.events.replace("_", ""))
    if args.kineto:
        print(describe_kineto(bench_kineto(n)))
        return 0
    try:  # a bad $PARTUI_HTA_PYTHON is refused now, not after the long cases
        hta_python = find_hta_python(args.hta_python) if args.real else None
    except ValueError as exc:
        print(f"partui bench analysis: {exc}", file=sys.stderr)
        return 2
    print("partui bench analysis: each case in its own process; wall and CPU seconds in that process, its peak "
          "RSS; goals are issue 36's, for a quiet 2-core machine")
    with tempfile.TemporaryDirectory() as folder:
        run_all(n, args.big_gb, args.real, folder, hta_python)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
