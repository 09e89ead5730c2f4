"""`partui bench trace`: tracing overhead on step time (sparse recording against full
viztracer, both against no tracer, same world, same run) and the analysis of a 1,000,000-event
trace (seconds and peak memory)."""
from __future__ import annotations

import argparse
import json
import statistics

from partui.bench.analysis import bench_analysis, describe
from partui.bench.harness import table
from partui.world import World


def overhead(world: int, plan_kw: dict, model: str, rounds: int, steps: int) -> list[dict]:
    times = {"off": [], "sparse": [], "full": []}
    with World() as w:
        w.plan("custom", model, world=world, **plan_kw)
        w.launch()
        w.step(2)  # warm-up
        for _ in range(rounds):  # interleave the three modes so noise hits all alike
            for mode in times:
                if mode != "off":
                    w.trace_on(sparse=(mode == "sparse"))
                lines = w.step(steps)
                if mode != "off":
                    w.trace_off(keep=False)
                times[mode] += [ln["step_ms"] for ln in lines]
    base = statistics.median(times["off"])
    return [{"mode": m, "step_ms": statistics.median(v),
             "overhead_pct": 100 * (statistics.median(v) / base - 1)} for m, v in times.items()]


def main(argv) -> int:
    ap = argparse.ArgumentParser(prog="partui bench trace", description=__doc__)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--zero", type=int, default=2)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    plan_kw = {"zero": args.zero} if args.world > 1 else {}
    rows = overhead(args.world, plan_kw, args.model, args.rounds, args.steps)
    ana = bench_analysis(args.events)
    if args.json:
        print(json.dumps({"overhead": rows, "analysis": ana}))
        return 0
    print(f"tracing overhead, world {args.world} {plan_kw or 'dp'} {args.model} "
          f"(median step of {args.rounds * args.steps}; target sparse <= 5%)")
    print(table(rows, ["mode", "step_ms", "overhead_pct"]))
    print("\n" + describe(ana))
    return 0
