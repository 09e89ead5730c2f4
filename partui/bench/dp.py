"""`partui bench dp`: bucketed DP against torch DDP, ZeRO-3 against torch FSDP2 (`fully_shard`),
same model, same world, same run, steps interleaved round-robin so machine noise hits all alike.

Every rank runs all four variants, in an order rotated every round (no variant always follows
the same one); a variant's step time is the slowest rank's, and the figure is the median over the
measured rounds. The torch peers use partui/bench_models.py (same shapes, same init) with torch's
own autograd and AdamW, and end their step as ours does: the global loss all-reduced over the
world (float64 scalar), so every rank knows it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from kernels.data import dp_slice, global_batch
from kernels.engine import Engine
from partui.bench.harness import table
from partui.bench.torch_models import TorchLlama
from partui.world.launch import run_world
from partui.world.plans import build_plan

VARIANTS = ("dp", "ddp", "zero3", "fsdp2")


def _rank_main(rank: int, world: int, opts: dict) -> dict:
    """One rank of a bench world (partui.world.launch.run_world: gloo joined, one torch thread)."""
    model, bucket = {"batch": opts["batch"]}, opts["bucket_mb"]
    ours = {}
    for name, preset in (("dp", "dp-bucketed"), ("zero3", "zero3")):
        plan, cfg = build_plan(preset, opts["model"], model, dp=world, bucket_mb=bucket)
        ours[name] = Engine(plan, cfg, rank, optim="adamw")
    from torch.distributed.fsdp import fully_shard  # lazy: FSDP2 is a heavy torch extra
    ddp = DDP(TorchLlama(cfg), bucket_cap_mb=bucket)
    fsdp = TorchLlama(cfg)
    for blk in fsdp.layers:
        fully_shard(blk)
    fully_shard(fsdp)
    torch_opt = {"ddp": (ddp, torch.optim.AdamW(ddp.parameters(), lr=1e-3, betas=(0.9, 0.95))),
                 "fsdp2": (fsdp, torch.optim.AdamW(fsdp.parameters(), lr=1e-3,
                                                   betas=(0.9, 0.95)))}
    denom = cfg.batch * cfg.seq

    def torch_step(name, step):
        model, opt = torch_opt[name]
        ids, tg = global_batch(cfg.batch, cfg.seq, cfg.vocab, 0, step)
        loss = model(dp_slice(ids, rank, world), dp_slice(tg, rank, world), denom)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        total = torch.tensor([loss.item()], dtype=torch.float64)  # as Engine.step: global loss
        dist.all_reduce(total)

    times = {v: [] for v in VARIANTS}
    overlap = {"dp": [], "zero3": []}
    wait = {"dp": [], "zero3": []}      # ms blocked on comm in the step (sync + loss)
    for step in range(opts["warmup"] + opts["steps"]):
        k = step % len(VARIANTS)
        for v in VARIANTS[k:] + VARIANTS[:k]:
            dist.barrier()
            t0 = time.perf_counter()
            if v in ours:
                res = ours[v].step()
            else:
                torch_step(v, step)
            ms = torch.tensor([(time.perf_counter() - t0) * 1e3])
            dist.all_reduce(ms, op=dist.ReduceOp.MAX)     # a step ends on its slowest rank
            if step >= opts["warmup"]:
                times[v].append(ms.item())
                if v in overlap and "grad_sync_overlap" in res.extra:
                    overlap[v].append(res.extra["grad_sync_overlap"])
                if v in wait:
                    wait[v].append(res.wait_ms)
    return {"times": {v: statistics.median(t) for v, t in times.items()},
            "overlap": {v: statistics.mean(o) if o else None for v, o in overlap.items()},
            "wait": {v: statistics.median(w) for v, w in wait.items()},
            "n_params": cfg.n_params()}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="partui bench dp", description=__doc__)
    ap.add_argument("--model", default="small", help="preset (tiny, small, medium, large)")
    ap.add_argument("--batch", type=int, default=8, help="global batch")
    ap.add_argument("--worlds", default="2,4", help="comma-separated world sizes")
    ap.add_argument("--steps", type=int, default=8, help="measured steps per variant")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--bucket-mb", type=float, default=4.0, help="ours and DDP's bucket size")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        worlds = [int(w) for w in args.worlds.split(",")]
    except ValueError:
        print(f"partui bench dp: --worlds {args.worlds!r} is not a list like 2,4", file=sys.stderr)
        return 2
    if any(w < 2 or args.batch % w for w in worlds) or args.steps < 1:
        print(f"partui bench dp: every world must be >= 2 and divide batch {args.batch}, and "
              f"--steps >= 1", file=sys.stderr)
        return 2
    opts = {"model": args.model, "batch": args.batch, "steps": args.steps,
            "warmup": args.warmup, "bucket_mb": args.bucket_mb}
    rows = []
    for w in worlds:
        try:
            r = run_world(w, _rank_main, opts, timeout_s=args.timeout, what=f"dp {w} world")[0]
        except (RuntimeError, TimeoutError) as e:
            print(f"partui bench dp: {e}", file=sys.stderr)
            return 1
        t = r["times"]
        rows.append({"world": w, "dp_ms": t["dp"], "ddp_ms": t["ddp"],
                     "dp/ddp": t["dp"] / t["ddp"], "zero3_ms": t["zero3"],
                     "fsdp2_ms": t["fsdp2"], "zero3/fsdp2": t["zero3"] / t["fsdp2"],
                     "dp_overlap": r["overlap"]["dp"], "zero3_overlap": r["overlap"]["zero3"],
                     "dp_wait_ms": r["wait"]["dp"]})
    cmd = "partui bench dp " + " ".join(argv)
    if args.json:
        print(json.dumps({"model": args.model, "batch": args.batch, "rows": rows,
                          "command": cmd}))
    else:
        print(f"model {args.model} ({r['n_params']} params), global batch {args.batch}, "
              f"1 thread per rank, median of {args.steps} interleaved steps (slowest rank)")
        print(table(rows, list(rows[0])))
        print(f"targets: dp/ddp <= 1.0, zero3/fsdp2 <= 0.8   ·   {cmd}")
    return 0
