"""`partui simulate`: build a pipeline schedule, replay it under a cost model, print grid, bubble and formula."""
from __future__ import annotations

import argparse
import json
import sys

from kernels.pp.schedules import SCHEDULE_NAMES, build_schedule, validate
from kernels.pp.simulate import Cost, formula_bubble, simulate, text_timeline

COST_KEYS = ("F", "B", "W", "FB", "p2p")


def parse_cost(text: str) -> Cost:
    """'F=1,B=2,W=1,FB=2.5,p2p=0' -> Cost; B is the full backward, W its weight-grad part."""
    values = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, number = item.partition("=")
        key = {k.lower(): k for k in COST_KEYS}.get(name.strip().lower().replace("&", ""))
        if not sep or key is None:
            raise ValueError(f"bad cost item {item!r}: write NAME=NUMBER with NAME one of {', '.join(COST_KEYS)}, "
                             f"e.g. --cost F=1,B=2,W=1,FB=2.5,p2p=0")
        try:
            values[key] = float(number)
        except ValueError:
            raise ValueError(f"cost {key}={number!r} is not a number: e.g. {key}=1") from None
    return Cost(**values)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("simulate", help="simulate a pipeline schedule: timeline, bubble, formula",
                              description="Replay a pipeline-parallel schedule as a dataflow under a cost model.")
    p.add_argument("--schedule", required=True, help=f"one of {', '.join(SCHEDULE_NAMES)}")
    p.add_argument("--pp", type=int, required=True, help="pipeline ranks")
    p.add_argument("--microbatches", type=int, required=True, help="microbatches per step")
    p.add_argument("--virtual", type=int, default=None, help="chunks per rank (interleaved; default 2)")
    p.add_argument("--cost", default="F=1,B=2,W=1", help="F, B (full backward), W, FB (overlapped pair, "
                   "default F+B), p2p: e.g. F=1,B=2,W=1,FB=2.5,p2p=0")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--timeline", action="store_true", help="draw the schedule grid")
    p.add_argument("--color", action="store_true", help="colour the grid cells by kind and direction")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    try:
        cost = parse_cost(args.cost)
        schedule = build_schedule(args.schedule, args.pp, args.microbatches, virtual=args.virtual)
        validate(schedule)
        result = simulate(schedule, cost)
    except ValueError as e:
        print(f"partui simulate: {e}", file=sys.stderr)
        return 2
    virtual = schedule.chunks_per_rank if schedule.name == "interleaved" else 1
    formula, formula_text = formula_bubble(schedule.name, schedule.pp, cost, virtual)
    if args.json:
        out = {"schedule": schedule.name, "pp": schedule.pp, "microbatches": schedule.microbatches,
               "virtual": schedule.chunks_per_rank, "stages": schedule.stages,
               "cost": {"F": cost.F, "B": cost.B, "W": cost.W, "FB": cost.fb, "p2p": cost.p2p},
               "makespan": result.makespan, "bubble": result.bubble, "bubble_rank": result.bubble_rank,
               "bubble_per_rank": result.bubble_per_rank, "busy_per_rank": result.busy,
               "formula_bubble": formula, "formula": formula_text,
               "peak_activations": result.peak_activations}
        if args.timeline:
            out["timeline"] = text_timeline(result)
        print(json.dumps(out))
        return 0
    print(f"{schedule.name}: pp {schedule.pp}, microbatches {schedule.microbatches}, "
          f"{schedule.stages} stages, {schedule.chunks_per_rank} chunk(s) per rank; makespan {result.makespan:g}")
    if args.timeline:
        print(text_timeline(result, color=args.color))
    for r, (idle, peak) in enumerate(zip(result.bubble_per_rank, result.peak_activations)):
        print(f"rank {r}: bubble {idle:g}  busy {result.busy[r]:g}  activations held ≤ {peak}")
    print(f"largest bubble {result.bubble:g} (rank {result.bubble_rank}); formula {formula_text} = {formula:g}")
    return 0
