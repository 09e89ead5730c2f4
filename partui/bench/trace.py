"""`partui bench trace`: tracing overhead on step time (sparse viztracer, the learner's
functions only, and full viztracer, every Python call, both against no tracing, in one world, the
three modes interleaved round by round) and the analysis of a 1,000,000-event
trace (seconds and peak memory)."""
from __future__ import annotations

import argparse
import json
import statistics
import time

from viztracer import log_sparse

from partui.bench.analysis import bench_analysis, describe
from partui.bench.args import whole_at_least_one
from partui.bench.harness import table
from partui.recording.trace import forget_viztracer, sparse_viztracer
from partui.world.world import World

MODES = ("off", "sparse", "full")
TARGET_SPARSE_PCT = 3.0


def overhead(world: int, plan_kw: dict, model: str, rounds: int, steps: int) -> list[dict]:
    """Per mode: median step ms over all rounds, and its overhead against no tracing as the median
    of the rounds' ratios (each round runs the three modes back to back, so a round's ratio meets
    the same machine load), with the spread (min, max) of those ratios. The sparse row adds an
    estimate no noise moves: its logged calls per step times log_sparse's cost per call."""
    times = {m: [] for m in MODES}  # per round: the median step of that mode
    worst = {m: [] for m in MODES}  # per round: the slowest step of that mode
    calls = {}                       # viztracer calls per step, the busiest rank
    with World() as w:
        w.plan("custom", model, world=world, **plan_kw)
        w.launch()
        w.step(2)  # warm-up
        for _ in range(rounds):
            for mode in MODES:
                if mode != "off":
                    w.trace_on(sparse=(mode == "sparse"))
                lines = w.step(steps)
                if mode != "off":
                    window = w.trace_off(keep=False)
                    calls[mode] = max(sum(e.get("cat") == "FEE" for e in r["events"]) for r in window) / steps
                times[mode].append(statistics.median(ln["step_ms"] for ln in lines))
                worst[mode].append(max(ln["step_ms"] for ln in lines))
    rows = overhead_rows(times, worst)
    call_us = log_sparse_call_us()
    for r in rows:
        if r["mode"] == "sparse":  # noise-free: its calls times one call's cost, against off's step
            r["calls_per_step"] = calls["sparse"]
            r["est_pct"] = 100 * calls["sparse"] * call_us / 1000 / rows[0]["step_ms"]
    return rows


def log_sparse_call_us(n: int = 20_000) -> float:
    """What log_sparse adds to one call, in us: a wrapped no-op against the bare one, here."""
    viz = sparse_viztracer(n + 10)
    try:
        bare = lambda: None  # noqa: E731
        wrapped = log_sparse(bare)
        per = {}
        for name, fn in (("bare", bare), ("wrapped", wrapped), ("bare", bare), ("wrapped", wrapped)):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            per[name] = min(per.get(name, float("inf")), (time.perf_counter_ns() - t0) / n / 1000)
        return max(0.0, per["wrapped"] - per["bare"])
    finally:
        viz.clear()
        forget_viztracer(viz)


def overhead_rows(times: dict[str, list[float]], worst: dict[str, list[float]] | None = None) -> list[dict]:
    """Rows of `overhead` from per-round median step ms per mode (times["off"] the baseline).
    worst (per round, the mode's slowest step): worst_ms, the slowest step of all rounds, and
    worst_pct, the largest over rounds of (slowest step / off's median in that round - 1). A stall
    in one traced step (issue 33: a collection pause) hides in the median; it shows here, and
    off's own worst_pct is the noise it is read against."""
    rows = []
    for mode, per_round in times.items():
        pct = sorted(100 * (t / off - 1) for t, off in zip(per_round, times["off"]))
        row = {"mode": mode, "step_ms": statistics.median(per_round),
               "overhead_pct": statistics.median(pct), "min_pct": pct[0], "max_pct": pct[-1]}
        if worst is not None:
            row["worst_ms"] = max(worst[mode])
            row["worst_pct"] = max(100 * (w / off - 1) for w, off in zip(worst[mode], times["off"]))
        rows.append(row)
    return rows


def verdict(row: dict) -> str:
    """What a mode's overhead figure says, given its spread over the rounds."""
    if row["mode"] == "off":
        return "baseline"
    spread = f"rounds {row['min_pct']:+.1f}% .. {row['max_pct']:+.1f}%"
    if row["overhead_pct"] < 0:
        return f"below the noise: tracing cannot speed a step up ({spread})"
    if row["min_pct"] < 0 < row["max_pct"]:
        return f"within the noise ({spread})"
    return spread


def main(argv) -> int:
    ap = argparse.ArgumentParser(prog="partui bench trace", description=__doc__)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--zero", type=int, default=2)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=whole_at_least_one("--rounds", 5), default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--events", type=int, default=1_000_000,
                    help="events in the synthetic trace the analysis part reads (0: skip that part)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.steps < 1 or args.events < 0:
        ap.error("--rounds and --steps must be at least 1 and --events at least 0 (0: no analysis)")
    plan_kw = {"zero": args.zero} if args.world > 1 else {}
    rows = overhead(args.world, plan_kw, args.model, args.rounds, args.steps)
    ana = bench_analysis(args.events) if args.events else None
    if args.json:
        print(json.dumps({"overhead": rows, "analysis": ana}))
        return 0
    print(f"tracing overhead on step time, world {args.world} {plan_kw or 'dp'} {args.model}: "
          f"{args.rounds} interleaved rounds of {args.steps} steps per mode; step_ms the median of "
          f"the rounds' median steps, overhead_pct the median over rounds of (mode / off in that "
          f"round - 1); goal sparse < {TARGET_SPARSE_PCT:g}%; worst_ms the slowest step of any "
          f"round, worst_pct the largest over rounds of (its slowest step / off's median in that "
          f"round - 1): a stall the median hides (off's own is the noise)")
    print(table([dict(r, spread=verdict(r)) for r in rows],
                ["mode", "step_ms", "overhead_pct", "worst_ms", "worst_pct", "spread"]))
    sparse = next(r for r in rows if r["mode"] == "sparse")
    print(f"sparse, viztracer's part estimated: {sparse['calls_per_step']:.0f} logged calls per step "
          f"(busiest rank) x log_sparse's cost per call measured here = {sparse['est_pct']:.2f}% of "
          f"the off step (the recorder's own spans come on top)")
    if ana is not None:
        print("\n" + describe(ana))
    return 0
