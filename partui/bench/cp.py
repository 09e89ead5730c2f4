"""`partui bench cp`: ring and zigzag attention against all-gathering K/V on every rank.

One gloo world runs every core in the same processes, steps interleaved (ring, zigzag,
allgather, [ulysses], ring, ...) so machine load hits them alike. Per core: attention time per
rank per step (wall, and the thread's CPU time, which a crowded machine does not inflate), the
slowest-to-fastest rank ratio (the load balance), the K/V rotation's overlap with block compute,
and step time (the slowest rank).

torch's own `context_parallel` (torch.distributed.tensor.experimental) does not run on CPU in
torch 2.13 (no sharding strategy for aten._scaled_dot_product_flash_attention_for_cpu, and other
errors for the other SDPA backends), so the peer here is the all-gather core.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from kernels.context import build_groups
from kernels.cp.apply import apply_context_parallel
from kernels.engine import Engine
from partui.world import launch
from partui.world.plans import build_plan

TORCH_CP_NOTE = ("torch's own context_parallel does not run on CPU in torch 2.13 (\"Operator "
                 "aten._scaled_dot_product_flash_attention_for_cpu.default does not have a "
                 "sharding strategy registered\", other errors for the other SDPA backends): the "
                 "peer is "
                 "all-gathering K/V on every rank, measured in the same run")


def parse(argv):
    ap = argparse.ArgumentParser(prog="partui bench cp", description=__doc__.splitlines()[0])
    ap.add_argument("--cp", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="measured steps per core")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--modes", default="ring,zigzag,allgather",
                    help="comma list of ring, zigzag, allgather, ulysses")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def _rank_rows(rank, world, opts) -> dict:
    """This rank's per-step rows for every core (runs inside the forked gloo world)."""
    base, cfg = build_plan("ring", "tiny", opts["model"], cp=world)
    groups = build_groups(base)
    engines = {}
    for mode in opts["modes"]:
        plan, _ = build_plan("ring", "tiny", opts["model"], cp=world,
                             cp_mode="ring" if mode == "allgather" else mode)
        eng = Engine(plan, cfg, rank, seed=0, groups=groups)
        if mode == "allgather":  # same contiguous layout as ring, K/V gathered instead
            apply_context_parallel(eng.layers, eng.ctx, "allgather")
        engines[mode] = eng
    rows = {m: [] for m in opts["modes"]}
    for step in range(opts["warmup"] + opts["steps"]):
        for mode, eng in engines.items():
            res = eng.step()
            if step >= opts["warmup"]:
                rows[mode].append({"step_ms": res.step_ms, "loss": res.loss,
                                   **{k: v for k, v in res.extra.items()
                                      if k.startswith("attn_")}})
    return rows


def summarise(per_rank: dict[int, dict], modes: list[str]) -> list[dict]:
    """One row per core: per-rank median attention time over the steps, balance ratios (slowest
    over fastest rank), overlap, median step time of the slowest rank."""
    table = []
    ranks = sorted(per_rank)
    for mode in modes:
        typical = lambda key, r: statistics.median(x[key] for x in per_rank[r][mode])  # noqa: E731
        wall = [typical("attn_ms", r) for r in ranks]
        cpu = [typical("attn_cpu_ms", r) for r in ranks]
        steps = [max(per_rank[r][mode][i]["step_ms"] for r in ranks)
                 for i in range(len(per_rank[ranks[0]][mode]))]
        table.append({"core": mode, "attn_ms": wall, "attn_cpu_ms": cpu,
                      "attn_gflop": [typical("attn_flops", r) / 1e9 for r in ranks],
                      "ratio_wall": max(wall) / min(wall), "ratio_cpu": max(cpu) / min(cpu),
                      "overlap_pct": statistics.fmean(typical("attn_overlap_pct", r)
                                                      for r in ranks),
                      "step_ms": statistics.median(steps),
                      "loss": per_rank[ranks[0]][mode][-1]["loss"]})
    base = next((row for row in table if row["core"] == "allgather"), None)
    for row in table:
        row["step_vs_allgather"] = row["step_ms"] / base["step_ms"] if base else None
        row["attn_vs_allgather"] = (max(row["attn_cpu_ms"]) / max(base["attn_cpu_ms"])
                                    if base else None)
    return table


def _fmt(xs):
    return " ".join(f"{x:7.1f}" for x in xs)


def main(argv: list[str]) -> int:
    args = parse(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    known = ("ring", "zigzag", "allgather", "ulysses")
    bad = [m for m in modes if m not in known]
    if bad or not modes:
        print(f"partui bench cp: unknown core(s) {bad or modes}: pick from {', '.join(known)}",
              file=sys.stderr)
        return 2
    model = {"seq": args.seq, "batch": args.batch, "dim": args.dim, "heads": args.heads,
             "kv_heads": args.kv_heads, "layers": args.layers}
    try:
        for m in modes:
            build_plan("ring", "tiny", model, cp=args.cp, cp_mode="ring" if m == "allgather" else m)
        if args.cp < 2:
            raise ValueError(f"--cp {args.cp}: context parallel needs --cp 2 or more")
    except ValueError as e:
        print(f"partui bench cp: {e}", file=sys.stderr)
        return 2
    opts = {"model": model, "modes": modes, "steps": args.steps, "warmup": args.warmup}
    try:
        per_rank = dict(enumerate(launch.run_world(
            args.cp, _rank_rows, opts, timeout_s=args.timeout, what=f"cp {args.cp} world",
            fix="try fewer --steps, a shorter --seq or a larger --timeout")))
    except (RuntimeError, TimeoutError) as e:
        print(f"partui bench cp: {e}", file=sys.stderr)
        return 1
    table = summarise(per_rank, modes)
    command = "partui bench cp " + " ".join(argv)
    if args.json:
        print(json.dumps({"command": command, "cp": args.cp, "model": model, "cores": table,
                          "note": TORCH_CP_NOTE}))
        return 0
    print(f"cp {args.cp} · seq {args.seq} · batch {args.batch} · dim {args.dim} · heads "
          f"{args.heads}/{args.kv_heads} kv · {args.layers} layers · {args.steps} steps per core "
          f"(+{args.warmup} warm-up), interleaved")
    print(f"{'core':10s} {'attention ms per rank (wall)':>32s} {'(cpu)':>32s} "
          f"{'max/min wall':>12s} {'max/min cpu':>11s} {'kv overlap':>10s} {'step ms':>8s} "
          f"{'vs allgather':>12s}")
    for row in table:
        vs = f"{row['step_vs_allgather']:.2f}x" if row["step_vs_allgather"] else "-"
        print(f"{row['core']:10s} {_fmt(row['attn_ms']):>32s} {_fmt(row['attn_cpu_ms']):>32s} "
              f"{row['ratio_wall']:12.2f} {row['ratio_cpu']:11.2f} {row['overlap_pct']:9.0f}% "
              f"{row['step_ms']:8.1f} {vs:>12s}")
    print("attention GFLOP per rank per step: " + "; ".join(
        f"{row['core']} " + " ".join(f"{x:.3f}" for x in row["attn_gflop"]) for row in table))
    print(f"note: {TORCH_CP_NOTE}")
    print(f"command: {command}")
    return 0
