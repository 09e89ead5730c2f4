"""`partui run`'s flags: argparse -> World fields, and field names in messages -> flags.

Plans, the kernels and World speak in fields (`microbatches=8`, `virtual_stages`), which the app's
command line takes as they are; on the command line the same message names flags (`--microbatches 8`,
`--virtual-stages`). FLAG_OF is the one table between the two. Light to import (argparse, re).
"""
from __future__ import annotations

import argparse
import math
import re

from partui.world.plans import MODEL_FIELDS
from planning import mesh
from planning.config import PRESETS as MODEL_PRESETS
from planning.moe_families import DEEPSEEK_ONLY
from planning.validate import DERIVED_BY_ZERO

PLAN_FLAGS = tuple(spec.name for spec in mesh.field_specs())   # generated: the Plan's own fields
TRAINING_FLAGS = ("seed", "optim", "lr", "weight_decay", "backward")
# field -> flag, for every field a message may name (plan, model, training)
FLAG_OF = {f: "--" + f.replace("_", "-")
           for f in (*PLAN_FLAGS, "model", *MODEL_FIELDS, *TRAINING_FLAGS, "steps", "link",
                     "ranks_per_node", "reference")}
MODEL_HELP = {"layers": "transformer layers", "dim": "model width", "heads": "attention heads",
              "kv_heads": "key / value heads (GQA), divides --heads",
              "seq": "tokens per sequence", "batch": "global batch (sequences per step)",
              "vocab": "vocabulary size",
              "hidden": "the dense MLP's hidden size (a multiple of 16 x tp)",
              "moe_every": "every Nth layer is MoE, with --experts"}
# store_true flags: `sp=True` reads `--sp`
SWITCHES = tuple(spec.name for spec in mesh.field_specs() if spec.kind is bool)
# bare field names that are never plain words (those with an underscore): translated where they
# stand alone in a message
BARE = tuple(f for f in FLAG_OF if "_" in f)
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
        if value == "None" or (field in DERIVED_BY_ZERO and value == "0"):   # the flag left out
            return f"no {FLAG_OF[field]}"
        return f"{FLAG_OF[field]} {value}"
    text = _BARE.sub(lambda m: FLAG_OF[m.group(1)], _ASSIGN.sub(assign, msg))
    return _LEFT_OUT.sub(r"\1 and no ", text)     # `--tp 1 no --world` -> `--tp 1 and no --world`


_LEFT_OUT = re.compile(r"(--[\w-]+(?: [\w.+-]+)?) no (?=--)")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    add_plan_arguments(p)
    add_training_arguments(p)


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """The plan flags, generated from the Plan's field metadata (planning.mesh.field_specs), and the
    model flags (`partui run`, `partui plan`)."""
    groups: dict = {}                    # section -> its argparse group
    for spec in mesh.field_specs():
        if spec.section not in groups:   # one group per concern (planning.mesh's field sections)
            groups[spec.section] = p.add_argument_group(
                f"plan: {spec.section} (unset flags take the Plan's defaults)")
        g = groups[spec.section]
        # choices are listed in the help, not enforced by argparse: the Plan's own message (one
        # line, naming a fix) stays the one answer to a bad value
        flag, text = "--" + spec.name.replace("_", "-"), spec.help
        if "default" not in text and spec.kind is not bool:
            text += f" (default {spec.default})" if spec.default not in ("", None) else " (default: off)"
        if spec.kind is bool:
            g.add_argument(flag, action="store_true", default=None, help=text)
            continue
        metavar = ("{" + ",".join(map(str, spec.choices)) + "}" if spec.choices else
                   "N" if spec.kind is int else spec.kind.__name__.upper())
        g.add_argument(flag, type=spec.kind, metavar=metavar, help=text)
    m = p.add_argument_group("model")
    m.add_argument("--model", default="tiny", metavar="{" + ",".join(MODEL_PRESETS) + "}",
                   help="model preset (default tiny); the flags below override its sizes")
    for name in MODEL_FIELDS:
        m.add_argument(FLAG_OF[name], type=int, default=None, metavar="N",
                       help=MODEL_HELP[name] + " (default: the model preset's)")


def add_training_arguments(p: argparse.ArgumentParser) -> None:
    """Training, output and tracing flags (`partui run`)."""
    t = p.add_argument_group("training")
    t.add_argument("--optim", default="adamw", choices=("adamw", "sgd"),
                   help="hand-written optimizer (default adamw)")
    t.add_argument("--backward", default="hand", choices=("hand", "autograd"),
                   help="hand backward, or autograd as an oracle where the forward does not "
                        "communicate (default hand)")
    t.add_argument("--steps", type=int, default=5, metavar="N", help="steps to train, >= 1 "
                                                                     "(default 5)")
    t.add_argument("--seed", type=int, default=0, metavar="N", help="init and data seed (default 0)")
    t.add_argument("--lr", type=float, default=None, metavar="LR",
                   help="learning rate, > 0 (default: the optimizer's)")
    t.add_argument("--weight-decay", type=float, default=None, metavar="WD",
                   help="weight decay, >= 0, decoupled (w *= 1 - lr x WD each step) in "
                        "AdamW and SGD alike (default: the optimizer's, AdamW 0.01, SGD 0)")
    p.add_argument("--json", action="store_true", help="one JSON object per step, then a summary")
    p.add_argument("--check", action="store_true",
                   help="compare the loss, every gradient and every parameter with the "
                        "single-process reference after each step; exit 1 if they differ")
    p.add_argument("--reference", default="hand", choices=("hand", "autograd"),
                   help="--check against: hand (the same layers, one process) or autograd (torch's "
                        "own modules, autograd and torch.optim; dense or MoE, fp32)")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="record a Chrome trace to this path (.json or .json.gz; opens in Perfetto)")
    p.add_argument("--trace-steps", default=None, metavar="A:B",
                   help="steps to trace with --trace, A included, B excluded: 2:4 traces steps 2 "
                        "and 3 (default all)")
    p.add_argument("--trace-full", action="store_true", help="full viztracer (slow) not sparse")
    p.add_argument("--trace-uncapped", action="store_true",
                   help="trace every step asked for (default: the last 50 of them)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="seconds any command to the ranks may take, > 0 (default 120)")
    add_link_arguments(p)


def add_link_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("emulated interconnect (planning/link.py)")
    g.add_argument("--link", default=None, metavar="PRESET|SPEC",
                   help="h800, h100 or a100 (scaled to this CPU by a calibration), or "
                        "alpha_us=A,gbps=B (latency us, gigabytes/s, this machine's time)")
    g.add_argument("--ranks-per-node", type=int, default=None, metavar="N",
                   help="ranks on one node (NVLink-class inside, IB-class between); default all")


def fields_from_args(args) -> dict:
    """The plan fields and model overrides given on the command line (the rest: the Plan's
    defaults; microbatches 0: the least the schedule takes, resolved where the plan meets its model)."""
    check_flag_values(args)
    names = (*(spec.name for spec in mesh.field_specs()), *MODEL_FIELDS)
    fields = {f: getattr(args, f) for f in names if getattr(args, f, None) is not None}
    return fields


def microbatches_note(args, plan: mesh.Plan) -> str:
    """What the summary says when --microbatches was taken by default ('' when it was given)."""
    if getattr(args, "microbatches", None) is not None or plan.pp <= 1:
        return ""
    return (f"microbatches {plan.microbatches} (not given: the least {plan.schedule} takes at "
            f"pp {plan.pp} that divides the per-rank batch)")


def check_flag_values(args) -> None:
    """Flag values outside their range that the Plan itself takes as 'not given' (dp 0) or that are
    not Plan fields (the optimizer's): ValueError naming the range."""
    if getattr(args, "dp", None) == 0:
        raise ValueError("--dp 0: data-parallel ranks are 1 or more; leave --dp out to derive it "
                         "from --world")
    if getattr(args, "world", None) == 0:
        raise ValueError("--world 0: a world is 1 rank or more; leave --world out to take the "
                         "product of the dims (or set --world 2)")
    schedule, pp = getattr(args, "schedule", None), getattr(args, "pp", None)
    if schedule == mesh.DEFAULT_SCHEDULE and (pp or 1) == 1:   # validate refuses the others at pp 1;
        raise ValueError(f"--schedule {schedule} orders a pipeline's stages, but there is none "  # the
                         f"(pp 1): set --pp 2 (or drop --schedule)")   # default it cannot tell given
    check_preset_routing(args)
    lr, wd = getattr(args, "lr", None), getattr(args, "weight_decay", None)
    if lr is not None and not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"--lr {lr:g}: the learning rate must be > 0 (and finite); try --lr 1e-3")
    if wd is not None and not (wd >= 0 and math.isfinite(wd)):
        raise ValueError(f"--weight-decay {wd:g}: weight decay must be >= 0 (and finite); try "
                         f"--weight-decay 0.01")



def check_preset_routing(args) -> None:
    """`--model deepseek-tiny --moe gshard`: the preset's own DeepSeek fields (none typed) would be
    blamed on flags the user never gave; name the preset instead."""
    preset = MODEL_PRESETS.get(getattr(args, "model", None))
    moe = getattr(args, "moe", None)
    if preset is None or moe is None or moe == preset.moe or not preset.experts:
        return
    typed = [f for f in DEEPSEEK_ONLY if getattr(args, f, None) is not None]
    if moe == "gshard" and not typed:
        own = ", ".join(f"{f.replace('_', ' ')} {getattr(preset, f)}" for f in DEEPSEEK_ONLY
                        if getattr(preset, f) != DEEPSEEK_ONLY[f])
        raise ValueError(f"--model {args.model} routes the DeepSeek way ({own}), but --moe gshard: "
                         f"drop --moe gshard, or set --model tiny --experts {preset.experts} "
                         f"--moe gshard")


def world_options(args) -> dict:
    """World's training options from the command line."""
    return {"seed": args.seed, "optim": args.optim, "lr": args.lr, "weight_decay": args.weight_decay,
            "backward": args.backward, "check": args.check, "timeout_s": args.timeout,
            "link": args.link, "ranks_per_node": args.ranks_per_node,
            "reference": args.reference}
