"""`partui whatif TRACE --link LINK`: replay a recorded trace's per-rank op graph under an emulated
link (and a compute scale) and predict step time, time blocked in waits and overlap per rank
(partui/analysis/replay/whatif.py). `--measured OTHER`: a trace of the same plan run under that link,
set beside the prediction with its error."""
from __future__ import annotations

import argparse
import json
import math
import sys

import pandas as pd
import torch

from kernels.calibrate import matmul_flops
from kernels.recompute import forward_share
from partui.analysis import TraceError, read_doc
from partui.analysis.figures.definitions import RECOMPUTE, WHATIF, WHATIF_PP, definitions, help_text
from partui.analysis.reading.kineto import is_kineto
from partui.analysis.replay.whatif import replay, steps_of
from partui.analysis.replay.whatif_pipe import repipe
from partui.analysis.replay.whatif_recompute import recompute_table
from partui.commands.flags import add_link_arguments, flagify
from partui.commands.report import FORMATS, render
from partui.world.layout import plan_layout
from planning.config import ModelConfig
from planning.link import LinkModel, build_link, check_link, parse_link
from planning.mesh import Plan


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("whatif", help="predict a recorded plan's step under another link",
                              epilog=help_text(WHATIF, WHATIF_PP, RECOMPUTE),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="a partui trace (.json or .json.gz) recorded with partui run --trace")
    p.add_argument("--compute-scale", type=float, default=1.0,
                   help="multiply every busy stretch (compute and host work) by this")
    p.add_argument("--measured", metavar="OTHER", help="a trace of the same plan run under --link")
    p.add_argument("--format", default="table", choices=FORMATS)
    p.add_argument("--floor", action="store_true",
                   help="a wait lasts at least its recorded length (predicts a --link run on this "
                        "machine, whose gloo still moves the bytes); default: a collective ends "
                        "no sooner than gloo delivered it in the trace, and a wait keeps its own "
                        "time past its op's end, as the emulated link holds them")
    p.add_argument("--link-only", action="store_true",
                   help="the link model alone: an op ends when the link says and a wait returns "
                        "then, however long this machine's gloo and wake-ups took (a cluster's "
                        "view)")
    p.add_argument("--pp", type=int, help="another pipeline size, through the schedule simulator "
                   "(a pipeline trace; the layers, the batch and dp stay)")
    p.add_argument("--microbatches", type=int, help="another microbatch count (same global batch)")
    p.add_argument("--recompute", choices=("selective", "full"),
                   help="what activation recompute would save and cost, from a trace recorded "
                        "without it (no --link needed): full runs each block's forward again, "
                        "selective only its norms, softmax and SwiGLU activation")
    add_link_arguments(p)
    p.set_defaults(func=run)
    return p


def measured_step_ms(doc: dict) -> float:
    """Mean over steps (warm-up out) of the slowest rank's step span."""
    per = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "step":
            k = e["args"].get("step", 0)
            per[k] = max(per.get(k, 0.0), e["dur"] / 1e3)
    keep = steps_of(doc)
    return sum(per[k] for k in keep) / len(keep)


RECORD = "record one: partui run --dp 2 --trace traces/run.json"


def read_partui_trace(path: str) -> dict:
    """The trace at `path`, or TraceError when it is not one whatif can replay: any JSON without a
    traceEvents list, and a torch.profiler trace (its ops have no partui op graph to replay)."""
    doc = read_doc(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{path}: not a partui trace (no traceEvents list): whatif replays a trace "
                         f"partui run records; {RECORD}")
    if is_kineto(doc):
        raise TraceError(f"{path}: not a partui trace but a torch.profiler one, whose ops have no "
                         f"partui op graph to replay (partui report reads it); {RECORD}")
    return doc


def link_for(args, doc: dict) -> LinkModel:
    if parse_link(args.link)[1] is not None:
        return build_link(args.link, args.ranks_per_node)
    meta = doc.get("metadata") or {}
    flops = (meta.get("link") or {}).get("cpu_flops") or 0.0
    if not flops:                      # calibrate here, on the trace's model, one thread
        if not isinstance(meta.get("model"), dict):
            raise TraceError(f"no model in the trace's metadata to scale --link {args.link} to this "
                             f"CPU by: give --link alpha_us=A,gbps=B, or {RECORD}")
        torch.set_num_threads(1)
        cfg = ModelConfig(**meta["model"])
        world = (meta.get("plan") or {}).get("world") or 1
        flops = matmul_flops(cfg, max(cfg.seq, cfg.batch * cfg.seq // world))
    return build_link(args.link, args.ranks_per_node, flops)


def predict(doc: dict, link: LinkModel, scale: float, floor: bool = False,
            link_only: bool = False) -> pd.DataFrame:
    """Per rank, the mean over the recorded steps (warm-up out) of the replay's figures."""
    if not steps_of(doc):
        raise TraceError(f"no step spans in the trace to replay; {RECORD}")
    frames = [replay(doc, link, scale, s, floor, link_only=link_only) for s in steps_of(doc)]
    return pd.concat(frames).groupby("rank", as_index=False).mean()


def run(args) -> int:
    if args.recompute:
        return recompute_report(args)
    if args.link is None:
        print("partui whatif: name the link to replay under: --link h800 (or alpha_us=A,gbps=B)",
              file=sys.stderr)
        return 2
    try:
        doc = read_partui_trace(args.trace)
        world = ((doc.get("metadata") or {}).get("plan") or {}).get("world") or 1
        check_link(args.link, args.ranks_per_node, world)
        if not (args.compute_scale > 0 and math.isfinite(args.compute_scale)):   # nan: no comparison holds
            raise ValueError(f"--compute-scale {args.compute_scale} must be a finite number > 0, "
                             f"e.g. --compute-scale 0.5")
        link = link_for(args, doc)
        if args.pp is not None or args.microbatches is not None:
            return _repipe(args, doc, link)
        table = predict(doc, link, args.compute_scale, args.floor, args.link_only)
        measured = measured_step_ms(read_partui_trace(args.measured)) if args.measured else None
    except (TraceError, ValueError, OSError) as e:
        print(f"partui whatif: {flagify(str(e))}", file=sys.stderr)
        return 2
    step = {"recorded_step_ms": table["recorded_step_ms"].max(),
            "predicted_step_ms": table["predicted_step_ms"].max()}
    if measured is not None:
        step["measured_step_ms"] = measured
        step["error_pct"] = 100 * (step["predicted_step_ms"] - measured) / measured
    if args.format == "json":
        print(json.dumps({"link": link.describe(), "ranks": table.round(3).to_dict("records"),
                          "step": {k: round(v, 3) for k, v in step.items()},
                          "definitions": definitions([*table.columns, *step])}))
        return 0
    print(render(table, args.format))
    print(render(pd.DataFrame([dict(rank="step", **step)]), args.format))
    if args.format == "table":
        print(f"\nlink: {link.describe()}\nrecorded: the trace's own step (slowest rank for the "
              f"step row); predicted: replayed under the link, busy stretches x"
              f"{args.compute_scale:g}; blocked: time blocked in waits (not the report's exposed "
              f"comm); busy overlap: comm in flight during busy time (partui whatif --help).")
    return 0


KEPT = {"full": "its blocks' inputs", "selective": "its blocks' matmul outputs and norm inputs"}
REDONE = {"full": "all of each forward", "selective": "norms, Q K^T and softmax, SwiGLU's "
                                                    "activation, by operation count"}


def recompute_report(args) -> int:
    """`--recompute full|selective`: per rank, activations saved (measured less the formula's
    under recompute) and the compute it adds (the recorded block forwards, or their share that
    selective runs again)."""
    try:
        doc = read_partui_trace(args.trace)
        meta = doc.get("metadata") or {}
        if "plan" not in meta or "model" not in meta:
            raise TraceError(f"{args.trace}: no plan / model in its metadata: record it with "
                             f"partui run --trace")
        plan = Plan.from_dict({**meta["plan"], "recompute": args.recompute})
        cfg = ModelConfig(**meta["model"])
        share = forward_share(args.recompute, cfg, cfg.seq)     # of the whole sequence's block
        table = recompute_table(doc, [r["predicted"] for r in plan_layout(plan, cfg)], args.trace,
                                share)
    except (TraceError, ValueError) as e:
        print(f"partui whatif: {flagify(str(e))}", file=sys.stderr)
        return 2
    print(render(table, args.format))
    if args.format == "table":
        print(f"\nactivations: the trace's measured peak; recompute: the formula's under "
              f"{args.recompute} recompute (each in-flight microbatch keeps {KEPT[args.recompute]};"
              f" - where the formula does not reach); extra compute: the recorded block forwards "
              f"per step x {share:.3f}, the part "
              f"run again ({REDONE[args.recompute]}), and its share of the rank's step")
    return 0


def _repipe(args, doc: dict, link: LinkModel) -> int:
    """`--pp` / `--microbatches`: the schedule simulator under the trace's own compute."""
    for name in ("pp", "microbatches"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ValueError(f"{name}={v} must be >= 1")
    if args.compute_scale != 1.0 or args.floor or args.measured:
        raise ValueError("--pp / --microbatches go through the schedule simulator: drop "
                         "--compute-scale, --floor and --measured")
    if args.link_only:
        raise ValueError("--pp / --microbatches go through the schedule simulator, which prices "
                         "p2p by the link alone already: drop --link-only")
    table, step = repipe(doc, link, args.pp, args.microbatches)
    if args.format == "json":
        print(json.dumps({"link": link.describe(), "stages": table.round(3).to_dict("records"),
                          "step": {k: round(v, 3) if isinstance(v, float) else v
                                   for k, v in step.items()},
                          "definitions": definitions(table.columns)}))
        return 0
    print(render(table, args.format))
    if args.format == "table":
        print(f"\n{step['schedule']} pp {step['pp']} x {step['microbatches']} microbatches (recorded"
              f" pp {step['recorded_pp']} x {step['recorded_microbatches']}), world "
              f"{step['world']}; link: {link.describe()}\n"
              f"per chunk and microbatch: F {step['F_ms']:.3f} ms, B {step['B_ms']:.3f} ms (W "
              f"{step['W_ms']:.3f}), p2p {step['p2p_ms']:.3f} ms: the trace's mean F/B/W action x "
              f"its stages, split over the new stages, x recorded / new microbatches; p2p: the "
              f"link's send of the recorded activation bytes so scaled.\n"
              f"sim pipe: the simulator's makespan; sim bubble: the stage's idle share of its own "
              f"first-to-last window; rest: the recorded step outside the pipeline window (loss, "
              f"grad sync, optimizer), slowest rank, without the link; predicted step = pipe + "
              f"rest.")
    return 0
