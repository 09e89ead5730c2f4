"""`partui run`'s flags: argparse -> World fields, and field names in messages -> flags.

Plans, the kernels and World speak in fields (`microbatches=8`, `virtual_stages`), which the app's
command line takes as they are; on the command line the same message names flags (`--microbatches 8`,
`--virtual-stages`). FLAG_OF is the one table between the two. Light to import (argparse, re).
"""
from __future__ import annotations

import argparse
import re

from kernels.mesh import Plan
from partui.plans import DEFAULT_VIRTUAL_STAGES, MODEL_FIELDS

PLAN_FLAGS = ("world", "dp", "zero", "grad_sync", "bucket_mb", "tp", "sp", "pp", "schedule",
              "microbatches", "virtual_stages", "cp", "cp_mode", "ep", "experts", "top_k",
              "capacity_factor", "overlap", "ep_dispatch", "dtype", "collectives")
TRAINING_FLAGS = ("seed", "optim", "lr", "weight_decay", "backward")
# field -> flag, for every field a message may name (plan, model, training)
FLAG_OF = {f: "--" + f.replace("_", "-")
           for f in (*PLAN_FLAGS, "model", *MODEL_FIELDS, *TRAINING_FLAGS, "steps", "reference")}
SWITCHES = ("sp", "overlap")           # store_true flags: `sp=True` reads `--sp`
# bare field names that are never plain words: translated where they stand alone in a message
BARE = ("virtual_stages", "cp_mode", "top_k", "capacity_factor", "grad_sync", "bucket_mb",
        "ep_dispatch", "kv_heads", "weight_decay")
_ASSIGN = re.compile(r"(?<![\w-])(" + "|".join(sorted(FLAG_OF, key=len, reverse=True))
                     + r")=([\w+-]+(?:\.\d+)?)")
_BARE = re.compile(r"(?<![\w-])(" + "|".join(BARE) + r")(?![\w=])")


def flagify(msg: str) -> str:
    """A message in field form as the CLI prints it: `field=value` -> `--flag value` (`sp=True` ->
    `--sp`), and the multi-letter field names of BARE -> `--flag`; plain words stay as they are."""
    def assign(m):
        field, value = m.group(1), m.group(2)
        if field in SWITCHES:
            return FLAG_OF[field] if value == "True" else f"no {FLAG_OF[field]}"
        return f"{FLAG_OF[field]} {value}"
    return _BARE.sub(lambda m: FLAG_OF[m.group(1)], _ASSIGN.sub(assign, msg))


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("plan (unset flags take the Plan's defaults)")
    actions = []

    def plan(*names, **kw):
        actions.append(g.add_argument(*names, **kw))
    plan("--world", type=int, help="ranks (default: the product of the dims)")
    plan("--dp", type=int, help="data-parallel ranks (default: derived from --world)")
    plan("--zero", type=int, help="ZeRO stage 0-3")
    plan("--grad-sync", choices=("naive", "bucketed"))
    plan("--bucket-mb", type=float)
    plan("--tp", type=int)
    plan("--sp", action="store_true", default=None, help="sequence parallel (with --tp)")
    plan("--pp", type=int)
    plan("--schedule", help="pipeline schedule")
    plan("--microbatches", type=int)
    plan("--virtual-stages", type=int, help=f"chunks per rank, interleaved only (default "
                                             f"{DEFAULT_VIRTUAL_STAGES})")
    plan("--cp", type=int)
    plan("--cp-mode", help="ring, zigzag or ulysses")
    plan("--ep", type=int)
    plan("--experts", type=int)
    plan("--top-k", type=int, help="experts per token")
    plan("--capacity-factor", type=float, help="expert capacity (default: no limit)")
    plan("--overlap", action="store_true", default=None, help="EP: overlap all-to-all with compute")
    plan("--ep-dispatch", choices=("uneven", "even"),
         help="EP all-to-all: uneven splits (counts exchanged first) or capacity-padded")
    plan("--dtype", help="fp32 or bf16")
    plan("--collectives", help="native or hand")
    defaults = Plan()
    for action in actions:           # the defaults shown are the Plan's own (switches: off)
        if "default" not in (action.help or "") and action.default is None and action.nargs != 0:
            action.help = f"{action.help or ''} (default {getattr(defaults, action.dest)})".strip()
    m = p.add_argument_group("model")
    m.add_argument("--model", default="tiny")
    for name in MODEL_FIELDS:
        m.add_argument(FLAG_OF[name], type=int, default=None)
    t = p.add_argument_group("training")
    t.add_argument("--optim", default="adamw", choices=("adamw", "sgd"))
    t.add_argument("--backward", default="hand", choices=("hand", "autograd"))
    t.add_argument("--steps", type=int, default=5)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--weight-decay", type=float, default=None)
    p.add_argument("--json", action="store_true", help="one JSON object per step, then a summary")
    p.add_argument("--check", action="store_true",
                   help="compare loss and every gradient with the single-process reference")
    p.add_argument("--reference", default="hand", choices=("hand", "autograd"),
                   help="--check against: hand (the same layers, one process) or autograd (torch's "
                        "own modules, autograd and torch.optim; dense fp32 models)")
    p.add_argument("--trace", default=None, help="record a Chrome trace to this path")
    p.add_argument("--trace-steps", default=None, help="steps to trace, e.g. 2:4 (default all)")
    p.add_argument("--trace-full", action="store_true", help="full viztracer (slow) not sparse")
    p.add_argument("--trace-uncapped", action="store_true",
                   help="trace every step asked for (default: the last 50 of them)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds any command may take")


def plan_fields(args) -> dict:
    """The plan fields and model overrides given on the command line (the rest: plans' defaults)."""
    return {f: getattr(args, f) for f in (*PLAN_FLAGS, *MODEL_FIELDS) if getattr(args, f) is not None}


def world_options(args) -> dict:
    """World's training options from the command line."""
    return {"seed": args.seed, "optim": args.optim, "lr": args.lr, "weight_decay": args.weight_decay,
            "backward": args.backward, "check": args.check, "timeout_s": args.timeout,
            "reference": args.reference}
