"""`partui run`'s flags: argparse -> World fields, and field names in messages -> flags.

Plans, the kernels and World speak in fields (`microbatches=8`, `virtual_stages`), which the app's
command line takes as they are; on the command line the same message names flags (`--microbatches 8`,
`--virtual-stages`). FLAG_OF is the one table between the two. Light to import (argparse, re).
"""
from __future__ import annotations

import argparse
import re

from kernels.config import PRESETS as MODEL_PRESETS
from kernels.ep.families import BALANCE_MODES, MOE_FAMILIES
from kernels.mesh import COLLECTIVES, CP_MODES, DTYPES, SCHEDULES, Plan
from partui.plans import DEFAULT_VIRTUAL_STAGES, MODEL_FIELDS

PLAN_FLAGS = ("world", "dp", "zero", "grad_sync", "bucket_mb", "tp", "sp", "pp", "schedule",
              "microbatches", "virtual_stages", "fb_overlap", "cp", "cp_mode", "ep", "experts", "top_k",
              "capacity_factor", "overlap", "ep_dispatch", "moe", "moe_hidden", "shared_experts",
              "route_scale", "route_groups", "route_topk_groups", "seq_aux_alpha", "balance",
              "bias_gamma", "dtype", "collectives")
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
SWITCHES = ("sp", "overlap", "fb_overlap")  # store_true flags: `sp=True` reads `--sp`
# bare field names that are never plain words: translated where they stand alone in a message
BARE = ("virtual_stages", "cp_mode", "top_k", "capacity_factor", "grad_sync", "bucket_mb",
        "ep_dispatch", "kv_heads", "weight_decay", "fb_overlap", "moe_every", "moe_hidden",
        "shared_experts", "route_scale", "route_groups", "route_topk_groups", "seq_aux_alpha",
        "bias_gamma", "ranks_per_node")
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
    add_plan_arguments(p)
    add_training_arguments(p)


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """The plan and model flags (`partui run`, `partui plan`)."""
    g = p.add_argument_group("plan (unset flags take the Plan's defaults)")
    actions = []

    def plan(*names, **kw):
        actions.append(g.add_argument(*names, **kw))
    # choices are listed in the help, not enforced by argparse: the Plan's own message (one line,
    # naming a fix) stays the one answer to a bad value
    plan("--world", type=int, metavar="N", help="ranks, >= 1 (default: the product of the dims)")
    plan("--dp", type=int, metavar="N", help="data-parallel ranks, >= 1 (default: derived from "
                                             "--world)")
    plan("--zero", type=int, metavar="{0,1,2,3}", help="ZeRO stage: 1 shards optimizer state, "
                                                       "2 also grads, 3 also params (needs --dp 2+)")
    plan("--grad-sync", choices=("naive", "bucketed"),
         help="DP grad sync: one all-reduce after backward, or buckets overlapped with backward")
    plan("--bucket-mb", type=float, metavar="MB", help="DP / ZeRO gradient bucket size, > 0")
    plan("--tp", type=int, metavar="N", help="tensor-parallel ranks; divides heads and kv heads")
    plan("--sp", action="store_true", default=None, help="sequence parallel (with --tp)")
    plan("--pp", type=int, metavar="N", help="pipeline ranks; stages divide the layers")
    plan("--schedule", metavar="{" + ",".join(SCHEDULES) + "}", help="pipeline schedule")
    plan("--microbatches", type=int, metavar="M",
         help="microbatches per step, >= 1; divides the per-rank batch")
    plan("--virtual-stages", type=int, metavar="V", help=f"chunks per rank, interleaved only, "
                                                         f">= 2 (default {DEFAULT_VIRTUAL_STAGES})")
    plan("--fb-overlap", action="store_true", default=None,
         help="PP x EP: each F&B pair of 1f1b, dualpipe or dualpipev interleaves the forward's and the "
              "backward's attention / expert parts so every all-to-all flies under the other microbatch")
    plan("--cp", type=int, metavar="N", help="context-parallel ranks; divides the sequence")
    plan("--cp-mode", metavar="{" + ",".join(CP_MODES) + "}",
         help="context-parallel attention: ring, zigzag (balanced causal ring) or Ulysses")
    plan("--ep", type=int, metavar="N", help="expert-parallel ranks (carved out of --dp); "
                                             "divides --experts")
    plan("--experts", type=int, metavar="E", help="experts per MoE layer (0: dense MLP)")
    plan("--top-k", type=int, metavar="K", help="experts per token, 1..--experts")
    plan("--capacity-factor", type=float, metavar="C",
         help="expert capacity, > 0 (default: no limit)")
    plan("--overlap", action="store_true", default=None, help="EP: overlap all-to-all with compute")
    plan("--ep-dispatch", choices=("uneven", "even"),
         help="EP all-to-all: uneven splits (counts exchanged first) or capacity-padded")
    # DeepSeek-V3's MoE (kernels/ep/deepseek.py); unset: the model's (--model deepseek-tiny sets them)
    models = "the model's"
    plan("--moe", choices=MOE_FAMILIES, help=f"MoE family: gshard (softmax, capacity, aux loss) or "
                                             f"deepseek (sigmoid, bias, shared experts) (default "
                                             f"{models})")
    plan("--moe-hidden", type=int, metavar=">=0",
         help=f"each routed expert's hidden size; fine-grained experts are narrow (default {models})")
    plan("--shared-experts", type=int, metavar=">=0",
         help=f"deepseek: always-applied experts beside the routed ones (default {models})")
    plan("--route-scale", type=float, metavar=">0",
         help=f"deepseek: gate values (normalised to sum 1) times this (default {models})")
    plan("--route-groups", type=int, metavar="G",
         help=f"deepseek: experts in G groups, G dividing --experts (default {models})")
    plan("--route-topk-groups", type=int, metavar="M",
         help=f"deepseek: each token routes inside its best M of the groups, 1 <= M <= G "
              f"(default {models})")
    plan("--seq-aux-alpha", type=float, metavar=">=0",
         help=f"deepseek: sequence-wise balance loss weight alpha (default {models})")
    plan("--balance", choices=BALANCE_MODES,
         help=f"deepseek: bias = auxiliary-loss-free balancing of the selection bias "
              f"(default {models})")
    plan("--bias-gamma", type=float, metavar=">=0",
         help=f"deepseek: bias update per step, +-gamma by load (default {models})")
    plan("--dtype", metavar="{" + ",".join(DTYPES) + "}",
         help="parameter and compute dtype")
    plan("--collectives", metavar="{" + ",".join(COLLECTIVES) + "}",
         help="native gloo collectives, or the hand-written ring / chain / pairwise ones")
    defaults = Plan()
    for action in actions:           # the defaults shown are the Plan's own (switches: off)
        if "default" not in (action.help or "") and action.default is None and action.nargs != 0:
            action.help = f"{action.help or ''} (default {getattr(defaults, action.dest)})".strip()
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
                   help="AdamW weight decay, >= 0 (default: the optimizer's)")
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
                   help="steps to trace, e.g. 2:4 (default all)")
    p.add_argument("--trace-full", action="store_true", help="full viztracer (slow) not sparse")
    p.add_argument("--trace-uncapped", action="store_true",
                   help="trace every step asked for (default: the last 50 of them)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="seconds any command to the ranks may take, > 0 (default 120)")
    add_link_arguments(p)


def add_link_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("emulated interconnect (kernels/link.py)")
    g.add_argument("--link", default=None, metavar="PRESET|SPEC",
                   help="h800, h100 or a100 (scaled to this CPU by a calibration), or "
                        "alpha_us=A,gbps=B (latency us, gigabytes/s, this machine's time)")
    g.add_argument("--ranks-per-node", type=int, default=None, metavar="N",
                   help="ranks on one node (NVLink-class inside, IB-class between); default all")


def plan_fields(args) -> dict:
    """The plan fields and model overrides given on the command line (the rest: plans' defaults)."""
    return {f: getattr(args, f) for f in (*PLAN_FLAGS, *MODEL_FIELDS) if getattr(args, f) is not None}


def world_options(args) -> dict:
    """World's training options from the command line."""
    return {"seed": args.seed, "optim": args.optim, "lr": args.lr, "weight_decay": args.weight_decay,
            "backward": args.backward, "check": args.check, "timeout_s": args.timeout,
            "link": args.link, "ranks_per_node": args.ranks_per_node,
            "reference": args.reference}
