"""`partui bench fb`: the overlapped F&B pair (--fb-overlap) on and off for 1F1B, DualPipeV and DualPipe, in
one gloo world per size, steps interleaved (on, off, on, off ...) so machine load hits both alike.

World 4 runs 1F1B and DualPipeV (pp 2 x dp 2 x ep 2); world 8 runs DualPipe (pp 4 x dp 2 x ep 2), which
needs twice the microbatches (--dualpipe-microbatches, --dualpipe-batch). Every rank records each step
(partui.recording.trace.RankTracer) and reads it with the analysis `partui report --by pair` uses
(partui.analysis.fb_pair_a2a), so the figures are the report's:
    pair_a2a_ms   all-to-all in flight, issued inside an F&B pair, per rank per step (summed per op). A pair
                  is an FB span; without --fb-overlap in 1F1B, a forward directly followed by a backward
    exposed_ms    of that, in flight while no part (or layer) of the pair computed; waits and posting an op
                  inside a part are not compute
    hidden_pct    100 * (1 - exposed_ms / pair_a2a_ms)
    step_ms       the whole training step, slowest rank, median over the measured steps
    expert_ms     expert compute (forward, dX, dW of the experts, merged) per rank per step
With --link every variant runs under the same emulated interconnect (planning/link.py); overlap pays only
where the all-to-all costs something, so the default link makes one all-to-all about one expert compute.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from kernels.calibrate import install_link
from kernels.context import build_groups
from kernels.engine import Engine
from partui.world import launch
from partui.analysis import fb_pair_a2a, frame
from partui.bench.args import whole_at_least_one
from partui.bench.ep import EXPERT_SPANS
from partui.bench.harness import table, traced_step
from partui.bench.own_device import cores_verdict, own_device
from partui.commands.flags import flagify
from partui.world.plans import build_plan
from partui.recording.tracefile import build_doc
from planning.intervals import length, merge
from planning.link import LinkModel, check_link
from planning.pipeline.catalog import schedule_spec, specs

# schedule -> pp: every schedule with F&B pairs; a mirrored one at pp 4 (two ranks each way)
SCHEDULES = {s.name: 4 if s.mirrored else 2 for s in specs(fb_overlap=True)}
COLUMNS = ["schedule", "fb_overlap", "world", "step_ms", "own_device_ms", "core_share_pct", "vs_off",
           "pair_a2a_ms", "exposed_ms", "hidden_pct", "expert_ms", "loss"]


def parse(argv):
    ap = argparse.ArgumentParser(prog="partui bench fb", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", default=",".join(SCHEDULES), help=f"comma list of "
                    f"{', '.join(SCHEDULES)}")
    ap.add_argument("--model", default="small")
    ap.add_argument("--layers", type=whole_at_least_one("--layers", 4), default=4)
    ap.add_argument("--seq", type=whole_at_least_one("--seq", 256), default=256)
    ap.add_argument("--batch", type=whole_at_least_one("--batch", 8), default=8, help="global batch of 1F1B and DualPipeV")
    ap.add_argument("--microbatches", type=whole_at_least_one("--microbatches", 4), default=4, help="1F1B and DualPipeV")
    ap.add_argument("--dualpipe-batch", type=whole_at_least_one("--dualpipe-batch", 16), default=16)
    ap.add_argument("--dualpipe-microbatches", type=whole_at_least_one("--dualpipe-microbatches", 8), default=8)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--ep-dispatch", default="even", choices=("uneven", "even"))
    ap.add_argument("--steps", type=whole_at_least_one("--steps", 3), default=3, help="measured steps per variant")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds for one world")
    ap.add_argument("--link", default="alpha_us=100,gbps=0.035", metavar="PRESET|SPEC",
                    help="the emulated link every variant runs under (planning/link.py); 'none' for none")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def pair_figures(recorded: dict) -> tuple[float, float, float]:
    """(pair all-to-all in flight, exposed, expert compute) in ms of one rank's recorded step."""
    df = frame(build_doc([recorded]))
    t = fb_pair_a2a(df)
    experts = df[df["name"].isin(EXPERT_SPANS)]
    expert_ms = length(merge(list(zip(experts["ts"], experts["end"])))) / 1e3   # us -> ms
    return float(t["in_flight_ms"].sum()), float(t["exposed_ms"].sum()), expert_ms


def _variants(opts: dict, world: int) -> list[tuple[str, bool, dict, dict]]:
    """(schedule, fb_overlap, plan fields, model overrides) of the chosen schedules this world runs."""
    out = []
    for s in opts["schedules"]:
        pp = SCHEDULES[s]
        if pp * 2 != world:                                # dp 2 (ep 2 inside it) x pp
            continue
        dual = schedule_spec(s).mirrored
        model = {"layers": opts["layers"], "seq": opts["seq"],
                 "batch": opts["dualpipe_batch"] if dual else opts["batch"]}
        fields = dict(pp=pp, dp=2, ep=2, experts=opts["experts"], schedule=s, ep_dispatch=opts["ep_dispatch"],
                      microbatches=opts["dualpipe_microbatches"] if dual else opts["microbatches"],
                      grad_sync="naive")
        out += [(s, True, fields, model), (s, False, fields, model)]
    return out


def _rank(rank, world, opts) -> list:
    """Per variant, per measured step: (step ms, pair a2a ms, exposed ms, expert ms, loss, recorded)."""
    variants = _variants(opts, world)
    base, cfg = build_plan("custom", opts["model"], variants[0][3], fb_overlap=False, **variants[0][2])
    groups = build_groups(base)
    engines = []
    for _s, fb, fields, model in variants:
        plan, cfg = build_plan("custom", opts["model"], model, fb_overlap=fb, **fields)
        engines.append(Engine(plan, cfg, rank, seed=0, lr=1e-3, groups=groups))
    link = install_link(opts["link"], None, cfg, world)
    out = [[] for _ in variants]
    for rnd in range(opts["warmup"] + opts["steps"]):
        for v, eng in enumerate(engines):
            res, recorded = traced_step(eng, rank)
            if rnd >= opts["warmup"]:
                out[v].append((res.step_ms, *pair_figures(recorded), res.loss, recorded))
    return [out, link.to_dict() if link is not None and rank == 0 else None]


def own_figures(variants: list, per_rank: list, world: int, steps: int, model: str,
                link: LinkModel | None) -> list[dict]:
    """Per variant, own_device_ms and core_share_pct (partui.bench.own_device on each measured step's
    recordings, per_rank[rank][variant][step][5]), the median over steps."""
    out = []
    for v, (_s, fb, fields, model_kw) in enumerate(variants):
        plan, _cfg = build_plan("custom", model, model_kw, fb_overlap=fb, **fields)
        own = [own_device([per_rank[r][v][i][5] for r in range(world)], plan, link) for i in range(steps)]
        out.append({"own_device_ms": None if link is None else statistics.median(o[0] for o in own),
                    "core_share_pct": statistics.median(o[1] for o in own)})
    return out


def rows_of(variants: list, per_rank: list, world: int, steps: int, own: list | None = None) -> list[dict]:
    """The table's rows from every rank's figures (per_rank[rank][variant][step]), with own_figures'
    per variant where given."""
    rows = []
    for v, (s, fb, _f, _m) in enumerate(variants):
        mine = [per_rank[r][v] for r in range(world)]
        n = world * steps
        a2a = sum(x[1] for pr in mine for x in pr) / n
        exposed = sum(x[2] for pr in mine for x in pr) / n
        rows.append({"schedule": s, "fb_overlap": "on" if fb else "off", "world": world,
                     "step_ms": statistics.median(max(pr[i][0] for pr in mine) for i in range(steps)),
                     **(own[v] if own else {}),
                     "pair_a2a_ms": a2a, "exposed_ms": exposed,
                     "hidden_pct": 100 * (1 - exposed / a2a) if a2a else None,
                     "expert_ms": sum(x[3] for pr in mine for x in pr) / n, "loss": mine[0][-1][4]})
    for row in rows:
        off = next(r for r in rows if r["schedule"] == row["schedule"] and r["fb_overlap"] == "off")
        row["vs_off"] = row["step_ms"] / off["step_ms"]
    return rows


def main(argv: list[str]) -> int:
    args = parse(argv)
    chosen = [s.strip() for s in args.schedules.split(",") if s.strip()]
    link = None if args.link == "none" else args.link
    try:
        if not chosen or any(s not in SCHEDULES for s in chosen):
            raise ValueError(f"--schedules {args.schedules}: pick from {', '.join(SCHEDULES)}")
        if args.steps < 1 or args.warmup < 0:
            raise ValueError(f"--steps {args.steps} / --warmup {args.warmup}: need steps >= 1, warmup >= 0")
        check_link(link, None, 8)
        opts = {"schedules": chosen, "model": args.model, "layers": args.layers, "seq": args.seq,
                "batch": args.batch, "microbatches": args.microbatches, "dualpipe_batch": args.dualpipe_batch,
                "dualpipe_microbatches": args.dualpipe_microbatches, "experts": args.experts,
                "ep_dispatch": args.ep_dispatch, "steps": args.steps, "warmup": args.warmup, "link": link}
        worlds = sorted({SCHEDULES[s] * 2 for s in chosen})
        for w in worlds:                                   # every plan valid before any world starts
            for _s, fb, fields, model in _variants(opts, w):
                build_plan("custom", args.model, model, fb_overlap=fb, **fields)
    except ValueError as e:
        print(f"partui bench fb: {flagify(str(e))}", file=sys.stderr)
        return 2
    rows, installed = [], None
    for w in worlds:
        try:
            res = launch.run_world(w, _rank, opts, timeout_s=args.timeout, what=f"fb world {w}",
                                      fix="try fewer --steps or --schedules, or a larger --timeout")
        except (RuntimeError, TimeoutError) as e:
            print(f"partui bench fb: {e}", file=sys.stderr)
            return 1
        installed = installed or res[0][1]
        per_rank = [r[0] for r in res]
        own = own_figures(_variants(opts, w), per_rank, w, args.steps, args.model,
                          LinkModel.from_dict(installed) if installed else None)
        rows += rows_of(_variants(opts, w), per_rank, w, args.steps, own)
    command = "partui bench fb " + " ".join(argv)
    verdict = cores_verdict(statistics.median(r["core_share_pct"] for r in rows), max(worlds))
    if args.json:
        print(json.dumps({"command": command, "link": installed, "rows": rows, "cores": verdict}))
        return 0
    print(f"{args.model} model, {args.layers} layers, seq {args.seq}, {args.experts} experts, "
          f"{args.ep_dispatch} dispatch, grad sync naive; {args.steps} measured steps a variant, interleaved")
    print(table(rows, COLUMNS))
    print("link: " + (LinkModel.from_dict(installed).describe() if installed else "none"))
    print("pair_a2a_ms: all-to-all in flight issued inside an F&B pair (without --fb-overlap in 1F1B: a forward "
          "directly followed by a backward), per rank per step; exposed_ms: of it, in flight while no part of "
          "the pair computed (waits and posting inside a part are not compute); hidden_pct: 100 * (1 - "
          "exposed / pair_a2a); step_ms: slowest rank, median; vs_off: step_ms / the same schedule's off; "
          "expert_ms: expert compute per rank per step; own_device_ms: whatif's replay of the same steps' "
          "traces under the link with each rank's busy time cut to the CPU time it got (one device per "
          "rank), median; core_share_pct: the ranks' CPU time over their busy time, all ranks, median")
    print(verdict)
    print(f"command: {command}")
    return 0
