"""`partui bench ep`: our expert parallel step against the same MoE with every expert on every
rank (no EP, no all-to-all) and against the all-to-all without overlap, in one gloo world.

For every variant each rank records each step as a trace (partui.recording.trace.RankTracer, the recorder
`partui run --trace` uses) and reads it with the analysis `partui report --by op` uses
(partui.analysis.overlap), so the figures and their definitions are the report's:
    a2a in flight      merged all-to-all time (ep group), issue to completion
    overlapped         the part of it during which this rank ran leaf compute (HTA's definition;
                       waits and posting an op are not compute, containers never count)
and the step time (slowest rank). "Saved" is what overlap really bought: the no-overlap step
time minus the overlap step time, as a share of the no-overlap all-to-all time (both under the
same link when --link is given). compute_ms is all leaf compute, so the halves' extra cost shows.
Variants run round-robin, so machine noise hits them alike. expert_ms is the expert compute
(forward, dX and dW of the experts, merged) per rank per step. With --link every variant runs under the same
emulated interconnect (planning/link.py), which is where overlap can pay.
"""
from __future__ import annotations

import argparse
import statistics
import sys

from kernels.calibrate import install_link
from kernels.engine import Engine
from partui.analysis import frame, overlap
from partui.bench.harness import table, traced_step
from partui.bench.own_device import cores_verdict, own_device
from partui.commands.flags import add_link_arguments, flagify
from partui.world.launch import run_world
from partui.world.plans import build_plan
from partui.recording.tracefile import build_doc
from planning.intervals import length, merge
from planning.link import LinkModel, check_link

VARIANTS = [  # name, ep (0: world), dispatch, overlap
    ("no EP: all experts on every rank", 1, "uneven", False),
    ("EP uneven a2a, no overlap", 0, "uneven", False),
    ("EP even (capacity-padded) a2a, no overlap", 0, "even", False),
    ("EP uneven a2a + overlap (ours)", 0, "uneven", True),
    ("EP even a2a + overlap", 0, "even", True),
]


EXPERT_SPANS = ("experts", "experts dX", "experts dW")   # kernels/ep/layer.py's spans


def a2a_figures(per_rank: dict) -> tuple[float, float, float, float]:
    """(all-to-all in flight, the part of it overlapped by compute, expert compute, all compute)
    in ms for one rank's recorded step: the trace `partui report --by op` reads, through the same
    analysis code."""
    df = frame(build_doc([per_rank]))
    row = overlap(df, by="op").query("op == 'all_to_all' and group == 'ep'")
    compute_ms = float(overlap(df, by="rank")["compute_ms"].sum())
    experts = df[df["name"].isin(EXPERT_SPANS)]
    expert_ms = length(merge(list(zip(experts["ts"], experts["end"])))) / 1e3   # us -> ms
    if not len(row):
        return 0.0, 0.0, expert_ms, compute_ms
    return float(row["comm_ms"].sum()), float(row["overlapped_ms"].sum()), expert_ms, compute_ms


def _rank(rank, world, opts):
    """One rank of the bench world (partui.world.launch.run_world): (the installed link as a dict or
    None, per variant per measured step its 6 figures and its recording)."""
    engines = []
    for _name, ep, dispatch, overlap in VARIANTS:
        plan, cfg = variant_plan(opts, world, ep, overlap)
        eng = Engine(plan, cfg, rank=rank, optim="sgd")
        for layer in eng.layers:
            if getattr(getattr(layer, "mlp", None), "is_moe", False):
                layer.mlp.dispatch = dispatch
        engines.append(eng)
    link = install_link(opts["link"], opts["ranks_per_node"], engines[0].cfg, world)
    out = [[] for _ in VARIANTS]
    for rnd in range(opts["warmup"] + opts["steps"]):
        for v, eng in enumerate(engines):
            res, recorded = traced_step(eng, rank)
            if rnd >= opts["warmup"]:
                out[v].append((res.step_ms, *a2a_figures(recorded), res.loss, recorded))
    return (link.to_dict() if link is not None else None), out


def variant_plan(opts: dict, world: int, ep: int, overlap: bool):
    return build_plan("custom", opts["model"], opts["overrides"], world=world, ep=ep or world,
                      experts=opts["experts"], top_k=opts["top_k"], capacity_factor=opts["cf"],
                      overlap=overlap)


def measure(world: int, opts: dict) -> list[dict]:
    got = run_world(world, _rank, opts, timeout_s=opts["timeout"], what=f"ep {world} world")
    opts["installed"] = got[0][0]
    results = {r: out for r, (_link, out) in enumerate(got)}
    link = LinkModel.from_dict(opts["installed"]) if opts["installed"] else None
    rows = []
    for v, (name, ep, _dispatch, overlap) in enumerate(VARIANTS):
        per_rank = [results[r][v] for r in range(world)]
        steps = [max(pr[s][0] for pr in per_rank) for s in range(opts["steps"])]
        plan, _cfg = variant_plan(opts, world, ep, overlap)
        own = [own_device([pr[s][6] for pr in per_rank], plan, link) for s in range(opts["steps"])]
        a2a = sum(s[1] for pr in per_rank for s in pr) / (world * opts["steps"])
        ovl = sum(s[2] for pr in per_rank for s in pr) / (world * opts["steps"])
        expert = sum(s[3] for pr in per_rank for s in pr) / (world * opts["steps"])
        compute = sum(s[4] for pr in per_rank for s in pr) / (world * opts["steps"])
        rows.append({"variant": name, "step_ms": statistics.median(steps),
                     "own_device_ms": statistics.median(o[0] for o in own) if link else None,
                     "core_share_pct": statistics.median(o[1] for o in own), "a2a_ms": a2a,
                     "expert_ms": expert, "compute_ms": compute,
                     "a2a_overlap_pct": 100 * ovl / a2a if a2a else None,
                     "loss": per_rank[0][-1][5]})
    base = rows[0]["step_ms"]
    for row, (_n, _ep, dispatch, overlap) in zip(rows, VARIANTS):
        row["vs_no_ep"] = row["step_ms"] / base
        if overlap:
            off = next(r for r, v in zip(rows, VARIANTS) if v[2] == dispatch and v[1] != 1 and not v[3])
            row["vs_no_overlap"] = row["step_ms"] / off["step_ms"]
            row["saved_ms"] = off["step_ms"] - row["step_ms"]
            row["saved_pct_of_a2a"] = 100 * row["saved_ms"] / off["a2a_ms"] if off["a2a_ms"] else None
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="partui bench ep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--model", default="small")
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--capacity-factor", type=float, default=1.25)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900.0)
    for name in ("layers", "dim", "seq", "batch"):
        ap.add_argument(f"--{name}", type=int, default=None)
    add_link_arguments(ap)
    a = ap.parse_args(argv)
    try:
        check_link(a.link, a.ranks_per_node, a.world)
    except ValueError as e:
        print(f"partui bench ep: {flagify(str(e))}", file=sys.stderr)
        return 2
    if a.world < 2 or a.experts % a.world:
        print(f"partui bench ep: --world {a.world} must be >= 2 and divide --experts {a.experts}",
              file=sys.stderr)
        return 2
    if a.capacity_factor is not None and a.capacity_factor <= 0:
        print(f"partui bench ep: capacity factor {a.capacity_factor} must be > 0", file=sys.stderr)
        return 2
    opts = {"model": a.model, "experts": a.experts, "top_k": a.top_k, "cf": a.capacity_factor,
            "steps": a.steps, "warmup": a.warmup, "timeout": a.timeout, "link": a.link,
            "ranks_per_node": a.ranks_per_node,
            "overrides": {k: getattr(a, k) for k in ("layers", "dim", "seq", "batch")}}
    try:
        rows = measure(a.world, opts)
    except (RuntimeError, ValueError, TimeoutError) as e:
        print(f"partui bench ep: {e}", file=sys.stderr)
        return 1
    print(table(rows, ["variant", "step_ms", "own_device_ms", "core_share_pct", "vs_no_ep",
                       "vs_no_overlap", "a2a_ms", "expert_ms", "compute_ms", "a2a_overlap_pct",
                       "saved_ms", "saved_pct_of_a2a", "loss"]))
    if opts.get("installed"):
        print(f"\nlink: {LinkModel.from_dict(opts['installed']).describe()}")
    print("\n" + legend(rows, bool(opts.get("installed"))))
    print(cores_verdict(statistics.median(r["core_share_pct"] for r in rows), a.world))
    print(f"command: partui bench ep {' '.join(argv)}")
    return 0


def legend(rows: list[dict], linked: bool) -> str:
    """What each column counts, and whether the uneven plan's all-to-all outweighs its experts."""
    off = next(r for r, v in zip(rows, VARIANTS) if v[1] != 1 and v[2] == "uneven" and not v[3])
    heavier = "at least" if off["a2a_ms"] >= off["expert_ms"] else "less than"
    return ("step_ms: median over steps of the slowest rank's step; a2a_ms: all-to-all (ep group) "
            "in flight per rank per step, issue to completion, merged; expert_ms: expert compute "
            "(forward, dX, dW); compute_ms: all leaf compute; a2a_overlap_pct: share of a2a_ms "
            "during compute (partui report --by op's definition).\n"
            "saved_ms: step_ms of the same plan without overlap minus step_ms with it"
            f"{', both under the same link' if linked else ''}; saved_pct_of_a2a: saved_ms as a % "
            "of the no-overlap plan's a2a_ms.\n"
            "own_device_ms: whatif's replay of the same steps' traces under the link, each rank's busy "
            "time cut to the CPU time it got (one device per rank; needs --link), median; "
            "core_share_pct: the ranks' CPU time over their busy time, median.\n"
            f"uneven, no overlap: a2a {off['a2a_ms']:.1f} ms is {heavier} its expert compute "
            f"{off['expert_ms']:.1f} ms.")
