"""`partui simulate`: build a pipeline schedule, replay it under a cost model, print grid, bubble and formula."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

from partui.analysis.table.events import TraceError
from partui.analysis.figures.pair_plan import from_trace
from planning.mesh import field_specs
from planning.pipeline.catalog import SCHEDULE_NAMES, build_schedule, formula_bubble
from planning.pipeline.part_costs import PART_KEYS, PartCost, cost_from_parts, pair_timeline, text_pair
from planning.pipeline.schedules import check_schedule
from planning.pipeline.simulate import Cost, simulate
from planning.pipeline.timeline import text_timeline

COST_KEYS = ("F", "B", "W", "FB", "p2p")
DEFAULT_COST = "F=1,B=2,W=1"


def _items(text: str, keys: tuple, what: str, example: str) -> dict:
    """'A=1,B=2' -> {key: number} for the given keys (case-insensitive names)."""
    values = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, number = item.partition("=")
        key = {k.lower(): k for k in keys}.get(name.strip().lower().replace("&", ""))
        if not sep or key is None:
            raise ValueError(f"bad {what} item {item!r}: write NAME=NUMBER with NAME one of {', '.join(keys)}, "
                             f"e.g. --{what} {example}")
        if key in values:                  # the second would silently win
            raise ValueError(f"{what} {key} is given twice ({text}): give each name once, e.g. "
                             f"--{what} {example}")
        try:
            values[key] = float(number)
        except ValueError:
            raise ValueError(f"{what} {key}={number!r} is not a number: e.g. {key}=1") from None
        if not math.isfinite(values[key]) or values[key] < 0:   # nan passes every comparison
            raise ValueError(f"{what} {key}={number.strip()} must be a finite number >= 0: e.g. {key}=1")
    return values


def parse_cost(text: str) -> Cost:
    """'F=1,B=2,W=1,FB=2.5,p2p=0' -> Cost; B is the full backward, W its weight-grad part."""
    return Cost(**_items(text, COST_KEYS, "cost", "F=1,B=2,W=1,FB=2.5,p2p=0"))


def parse_parts(text: str) -> PartCost:
    """'ATTN=1,MLP=1,A2A=1,layers=2' -> PartCost: one MoE layer's parts and its all-to-all."""
    values = _items(text, PART_KEYS, "parts", "ATTN=1,MLP=1,A2A=1,layers=1")
    if "layers" in values:
        if values["layers"] != int(values["layers"]):
            raise ValueError(f"parts layers={values['layers']:g} must be a whole number: e.g. layers=2")
        values["layers"] = int(values["layers"])
    return PartCost(**values)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("simulate", help="simulate a pipeline schedule: timeline, bubble, formula",
                              description="Replay a pipeline-parallel schedule as a dataflow under a cost model.")
    p.add_argument("--schedule", required=True, help=f"one of {', '.join(SCHEDULE_NAMES)}")
    p.add_argument("--pp", type=int, required=True, help="pipeline ranks")
    p.add_argument("--microbatches", type=int, required=True, help="microbatches per step")
    p.add_argument("--virtual", type=int, default=None, help="chunks per rank (interleaved; default 2)")
    p.add_argument("--cost", default=None, help=f"F, B (full backward), W, FB (overlapped pair, "
                   f"default F+B), p2p: e.g. F=1,B=2,W=1,FB=2.5,p2p=0 (default {DEFAULT_COST})")
    p.add_argument("--parts", default=None, help="chunk-level costs instead of --cost: one MoE layer's "
                   "ATTN, MLP, COMBINE, A2A (one all-to-all; A2A_DISPATCH_F, A2A_COMBINE_F, A2A_COMBINE_B, "
                   "A2A_DISPATCH_B: each kind's own), ATTN_B, MLP_B, ATTN_W, MLP_W, and layers per "
                   "chunk, e.g. ATTN=1,MLP=1,A2A=1,layers=1; F, B, W and the F&B pair's cost follow. Or a "
                   "torch.profiler trace with part annotations (attn(F), dispatch(B) ...): its measured "
                   "part costs (ms), and its recorded pair beside the planner's")
    p.add_argument("--fb-overlap", action="store_true", help="F&B pairs interleave their parts (1f1b "
                   "gets combined pairs); with --parts the pair costs its overlapped time, and --timeline "
                   "draws its inner order")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--timeline", action="store_true", help="draw the schedule grid")
    p.add_argument("--color", action="store_true", help="colour the grid cells by kind and direction")
    p.set_defaults(func=run)
    return p


# the simulator steps every action of every rank: past this many the answer would take minutes
MAX_SIMULATED_ACTIONS = 2_000_000
SIZE_FLAGS = {"pp": "pp", "microbatches": "microbatches", "virtual": "virtual_stages"}


def check_sizes(args) -> None:
    """--pp, --microbatches and --virtual by the Plan fields' own ranges, then the simulation's size
    (actions over all ranks) against what answers in seconds; ValueError naming the flag and a fix."""
    specs = {s.name: s for s in field_specs()}
    for flag, name in SIZE_FLAGS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        found = (value < 1 and (f"{name} {value} must be >= 1", [])) or specs[name].problem(value)
        if found:   # the Plan's messages; a simulated schedule needs every count >= 1
            raise ValueError(f"--{flag} {value}: {found[0]}; e.g. --{flag} {max(1, min(abs(value), 4))}")
    actions = args.pp * args.microbatches * (args.virtual or 2) * 2
    if actions > MAX_SIMULATED_ACTIONS:
        raise ValueError(f"--pp {args.pp} x --microbatches {args.microbatches} is about {actions:,} actions "
                         f"to simulate (at most {MAX_SIMULATED_ACTIONS:,} answer in seconds): lower --pp or "
                         f"--microbatches, e.g. --pp 8 --microbatches 32")


def run(args) -> int:
    try:
        check_sizes(args)
        if args.parts is not None and args.cost is not None:
            raise ValueError("give --cost or --parts, not both: --parts derives F, B, W and the pair's cost")
        recorded = None
        if args.parts is not None and os.path.exists(args.parts):   # a trace: its measured parts
            try:
                parts, recorded = from_trace(args.parts)
            except TraceError as exc:
                raise ValueError(str(exc)) from None
        else:
            parts = parse_parts(args.parts) if args.parts is not None else None
        cost = (cost_from_parts(parts, args.fb_overlap) if parts is not None
                else parse_cost(args.cost or DEFAULT_COST))
        schedule = build_schedule(args.schedule, args.pp, args.microbatches, virtual=args.virtual,
                                  fb_overlap=args.fb_overlap)
        check_schedule(schedule)
        result = simulate(schedule, cost)
    except ValueError as e:
        print(f"partui simulate: {e}", file=sys.stderr)
        return 2
    formula, formula_text = formula_bubble(schedule.name, schedule.pp, cost, schedule.chunks_per_rank)
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
        if recorded is not None:
            out["recorded_vs_planner"] = recorded
        if parts is not None:
            tl = pair_timeline(parts, args.fb_overlap)
            out["pair"] = {"overlapped": args.fb_overlap, "makespan": tl.makespan, "exposed_comm": tl.exposed_comm,
                           "compute": [list(x) for x in tl.compute], "comm": [list(x) for x in tl.comm]}
        print(json.dumps(out))
        return 0
    print(f"{schedule.name}: pp {schedule.pp}, microbatches {schedule.microbatches}, "
          f"{schedule.stages} stages, {schedule.chunks_per_rank} chunk(s) per rank; makespan {result.makespan:g}")
    if args.timeline:
        print(text_timeline(result, color=args.color, kinds=True))
        if parts is not None and args.fb_overlap:
            print(text_pair(parts))
    for r, (idle, peak) in enumerate(zip(result.bubble_per_rank, result.peak_activations)):
        print(f"rank {r}: bubble {idle:g}  busy {result.busy[r]:g}  activations held ≤ {peak}")
    print(f"largest bubble {result.bubble:g} (rank {result.bubble_rank}); formula {formula_text} = {formula:g}")
    if recorded is not None:
        print(recorded)
    return 0
