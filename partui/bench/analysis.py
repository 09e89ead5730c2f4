"""The analysis benchmark: a synthetic partui trace of about n events, written, loaded and analysed
(per rank, per step, per op), with wall and CPU seconds per phase and peak memory (`partui bench
trace` runs it too).

    python -m partui.bench.analysis 1000000      # the figure, each line saying what it counts
"""
from __future__ import annotations

import os
import resource
import sys
import tempfile
import time

import numpy as np

from partui.analysis import load, overlap_views
from partui.tracefile import FORMAT, write_atomic


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
                         "plan": {"pp": ranks, "schedule": "1f1b", "microbatches": 2 * ranks},
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


def main(argv: list[str]) -> int:
    n = int(argv[0].replace("_", "")) if argv else 1_000_000
    print(describe(bench_analysis(n)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
