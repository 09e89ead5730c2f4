"""`partui plan [plan flags]`: the plan's layout without launching: every global rank with its
coordinates, groups, stages and layers, shards, experts and memory ledger (partui.world.layout), as a table
or `--json`, with each rank's memory estimated from the sizes alone beside the prediction. Exit 2 on
a bad plan (one line naming the flag and a fix), one whose world would not fit this machine's RAM
too (partui.world.plans.build_plan, before torch loads)."""
from __future__ import annotations

import argparse
import json
import sys

from partui.commands.flags import add_plan_arguments, fields_from_args, flagify, microbatches_note
from partui.checkpoints.checkpoint import check_resume
from partui.world.plans import MODEL_FIELDS, build_plan
from planning.mesh import Plan


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("plan", help="every rank's groups, shards and memory, "
                                           "without launching")
    add_plan_arguments(p)
    p.add_argument("--json", action="store_true",
                   help="one JSON object: the plan, the model and a list of ranks")
    p.add_argument("--trace", metavar="TRACE",
                   help="a partui trace of this plan: its measured memory beside the prediction")
    p.add_argument("--resume", metavar="DIR",
                   help="a checkpoint (or --save DIR): per tensor, which saved ranks supply which "
                        "pieces to which of this plan's ranks, and the bytes each reads")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    try:
        fields = fields_from_args(args)
        model = {k: fields.pop(k) for k in list(fields) if k in MODEL_FIELDS}
        plan, cfg = build_plan("custom", args.model, model, **fields)
    except ValueError as e:                       # PlanError too: one line, in flags
        print(f"partui plan: {flagify(str(e))}", file=sys.stderr)
        return 2
    if args.resume:
        return show_reshard(args, plan, cfg)
    from partui.world.layout import layout_text, memory_text, plan_layout  # torch: only once the plan is valid
    measured = None
    if args.trace:
        from partui.analysis.table.events import TraceError  # pandas: only when a trace is read
        from partui.analysis.figures.memory import memory_table
        try:
            measured = memory_table(args.trace)[0].to_dict("records")
        except TraceError as e:
            print(f"partui plan: --trace: {e}", file=sys.stderr)
            return 2
        if len(measured) != plan.world:
            print(f"partui plan: --trace {args.trace} has {len(measured)} ranks, the plan "
                  f"{plan.world}: give the flags the trace was recorded with", file=sys.stderr)
            return 2
    ranks = plan_layout(plan, cfg)
    if args.json:
        doc = {"plan": plan.to_dict(), "model": cfg.to_dict(), "ranks": ranks}
        print(json.dumps({**doc, "measured": measured} if measured else doc))
    else:
        note = microbatches_note(args, plan)
        print(layout_text(plan, cfg, ranks) + "\n\n" + memory_text(ranks, measured)
              + (f"\n{note}" if note else ""))
    return 0


def show_reshard(args, plan, cfg) -> int:
    """The reshard map of `--resume DIR` onto this plan (partui.checkpoints.reshard_map); nothing launched."""
    from partui.checkpoints.reshard_map import reshard_map, reshard_text   # torch: only a valid plan's map
    try:
        ckpt, man = check_resume(args.resume, plan, cfg, {})   # the run's own seed / optim
    except ValueError as e:
        print(f"partui plan: {e}", file=sys.stderr)
        return 2
    doc = reshard_map(ckpt, plan, cfg)
    if args.json:
        print(json.dumps({"checkpoint": ckpt, "saved_plan": man["plan"], "plan": plan.to_dict(),
                          **doc}))
    else:
        print(reshard_text(doc, Plan.from_dict(man["plan"]).describe(), plan.describe()))
    return 0
