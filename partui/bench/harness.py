"""Small helpers shared by the benchmarks: interleaved timing and a printed table."""
from __future__ import annotations

import json
import statistics
import time

from kernels import comm
from partui.recording.trace import RankTracer


def interleaved(fns: dict, rounds: int, warmup: int = 2) -> dict[str, float]:
    """Median ms of each callable, measured round-robin so machine noise hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def table(rows: list[dict], cols: list[str]) -> str:
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in cols]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] +
                     [line([_fmt(r.get(c)) for c in cols]) for r in rows])


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return "" if v is None else str(v)


def print_rows(rows: list[dict], cols: list[str], title: str, as_json: bool) -> None:
    """A bench's result: one JSON list, or its title over a table."""
    if as_json:
        print(json.dumps(rows))
    else:
        print(title)
        print(table(rows, cols))


def traced_step(eng, rank: int):
    """(StepResult, this rank's recorded trace) of one engine step, every rank starting it together: the
    recorder `partui run --trace` uses, for benches that read their figures with the report's analysis."""
    rec = RankTracer(rank, python=False)
    comm.barrier(comm.world_group())
    rec.start()
    res = eng.step()
    return res, rec.stop()
