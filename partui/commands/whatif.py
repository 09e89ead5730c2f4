"""`partui whatif TRACE --link LINK`: replay a recorded trace's per-rank op graph under an emulated
link (and a compute scale) and predict step time, exposed comm and overlap per rank
(partui/analysis/whatif.py). `--measured OTHER`: a trace of the same plan run under that link,
set beside the prediction with its error."""
from __future__ import annotations

import argparse
import json
import sys

import pandas as pd
import torch

from kernels.calibrate import matmul_flops
from kernels.link import LinkModel, build_link, check_link, parse_link
from kernels.config import ModelConfig
from partui.analysis import TraceError, read_doc
from partui.analysis.whatif import replay
from partui.commands.flags import add_link_arguments, flagify
from partui.commands.report import FORMATS, render


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("whatif", help="predict a recorded plan's step under another link")
    p.add_argument("trace", help="a partui trace (.json or .json.gz) recorded with partui run --trace")
    p.add_argument("--compute-scale", type=float, default=1.0,
                   help="multiply every busy stretch (compute and host work) by this")
    p.add_argument("--measured", metavar="OTHER", help="a trace of the same plan run under --link")
    p.add_argument("--format", default="table", choices=FORMATS)
    p.add_argument("--floor", action="store_true",
                   help="a wait lasts at least its recorded length (predicts a --link run on this "
                        "machine, whose gloo still moves the bytes); default: the link model alone")
    add_link_arguments(p)
    p.set_defaults(func=run)
    return p


def steps_of(doc: dict) -> list[int]:
    """The recorded steps, the first left out as a warm-up when there are more."""
    s = sorted({e["args"].get("step", 0) for e in doc["traceEvents"]
                if e.get("ph") == "X" and e.get("cat") == "step"})
    return s[1:] if len(s) > 1 else s


def measured_step_ms(doc: dict) -> float:
    """Mean over steps (warm-up out) of the slowest rank's step span."""
    per = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "step":
            k = e["args"].get("step", 0)
            per[k] = max(per.get(k, 0.0), e["dur"] / 1e3)
    keep = steps_of(doc)
    return sum(per[k] for k in keep) / len(keep)


def link_for(args, doc: dict) -> LinkModel:
    if parse_link(args.link)[1] is not None:
        return build_link(args.link, args.ranks_per_node)
    meta = doc.get("metadata") or {}
    flops = (meta.get("link") or {}).get("cpu_flops") or 0.0
    if not flops:                      # calibrate here, on the trace's model, one thread
        torch.set_num_threads(1)
        cfg = ModelConfig(**meta["model"])
        world = (meta.get("plan") or {}).get("world") or 1
        flops = matmul_flops(cfg, max(cfg.seq, cfg.batch * cfg.seq // world))
    return build_link(args.link, args.ranks_per_node, flops)


def predict(doc: dict, link: LinkModel, scale: float, floor: bool = False) -> pd.DataFrame:
    """Per rank, the mean over the recorded steps (warm-up out) of the replay's figures."""
    frames = [replay(doc, link, scale, s, floor) for s in steps_of(doc)]
    return pd.concat(frames).groupby("rank", as_index=False).mean()


def run(args) -> int:
    if args.link is None:
        print("partui whatif: name the link to replay under: --link h800 (or alpha_us=A,gbps=B)",
              file=sys.stderr)
        return 2
    try:
        doc = read_doc(args.trace)
        world = ((doc.get("metadata") or {}).get("plan") or {}).get("world") or 1
        check_link(args.link, args.ranks_per_node, world)
        if args.compute_scale <= 0:
            raise ValueError(f"--compute-scale {args.compute_scale} must be > 0, e.g. 0.5")
        link = link_for(args, doc)
        table = predict(doc, link, args.compute_scale, args.floor)
        measured = measured_step_ms(read_doc(args.measured)) if args.measured else None
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
                          "step": {k: round(v, 3) for k, v in step.items()}}))
        return 0
    print(render(table, args.format))
    print(render(pd.DataFrame([dict(rank="step", **step)]), args.format))
    if args.format == "table":
        print(f"\nlink: {link.describe()}\nrecorded: the trace's own step (slowest rank for the "
              f"step row); predicted: replayed under the link, busy stretches x"
              f"{args.compute_scale:g}; exposed: time blocked in waits; overlap: comm in flight "
              f"during busy time.")
    return 0
