"""`partui bench checkpoint`: save and load seconds and bytes on disk per plan, beside torch's FSDP2
(`fully_shard`) saving the same model and AdamW state through DCP (`get_state_dict`), in the same
world and the same run. Rounds interleave the variants (rotated each round) so machine noise hits
all alike; a figure is the median over rounds of the slowest rank's seconds.

    save_s       one checkpoint written, every rank (DCP's plan, the files, the metadata)
    load_s       one checkpoint read back into the live state, every rank (the same plan)
    disk_bytes   the files of one checkpoint on disk (DCP's per-item framing included)
    payload      the tensor elements the index lists x their element size: params, AdamW m and v,
                 buffers; `once` = payload / (model + optimizer state once over), 1.00 when no
                 replica is written twice
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed import checkpoint as tdcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from kernels.checkpoint import load_engine, save_engine
from kernels.comm import dcp
from kernels.data import dp_slice, global_batch
from kernels.engine import Engine
from partui.bench.harness import table
from partui.bench.torch_models import TorchLlama
from partui.world.launch import run_world
from partui.world.plans import build_plan
from planning.config import param_shapes

PLANS = {"dp2": ("custom", {"dp": 2}), "zero1": ("custom", {"dp": 2, "zero": 1}),
         "zero2": ("custom", {"dp": 2, "zero": 2}), "zero3": ("custom", {"dp": 2, "zero": 3}),
         "tp2": ("custom", {"tp": 2, "sp": True}), "pp2": ("custom", {"pp": 2, "schedule": "1f1b"}),
         "dualpipe": ("custom", {"pp": 2, "schedule": "dualpipe"})}
ELEMENT = {"float32": 4, "bfloat16": 2, "int64": 8}


def fsdp2_variant(cfg, rank: int, world: int):
    """FSDP2 over the same model with torch's AdamW, one step taken so its state exists."""
    from torch.distributed.fsdp import fully_shard  # lazy: FSDP2 is a heavy torch extra
    model = TorchLlama(cfg)
    for blk in model.layers:
        fully_shard(blk)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    ids, tg = global_batch(cfg.batch, cfg.seq, cfg.vocab, 0, 0)
    model(dp_slice(ids, rank, world), dp_slice(tg, rank, world), cfg.batch * cfg.seq).backward()
    opt.step()

    def save(path):
        msd, osd = get_state_dict(model, opt)
        tdcp.save({"model": msd, "optim": osd}, checkpoint_id=path)

    def load(path):
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd}
        tdcp.load(sd, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    return save, load


def _rank_main(rank: int, world: int, opts: dict) -> dict:
    variants, cfg = {}, None
    for name in opts["plans"]:
        preset, fields = PLANS[name]
        plan, cfg = build_plan(preset, opts["model"], {}, **fields)
        eng = Engine(plan, cfg, rank, optim="adamw")
        eng.step()                                  # AdamW's state exists and is not all zero
        variants[name] = (lambda p, e=eng: save_engine(e, p), lambda p, e=eng: load_engine(e, p))
    variants["fsdp2"] = fsdp2_variant(cfg, rank, world)
    root = opts["root"]
    times = {v: {"save": [], "load": []} for v in variants}
    names = list(variants)
    for r in range(opts["warmup"] + opts["rounds"]):
        k = r % len(names)
        for v in names[k:] + names[:k]:
            path = os.path.join(root, f"{v}-{r}")
            for what in ("save", "load"):
                dist.barrier()
                t0 = time.perf_counter()
                variants[v][0 if what == "save" else 1](path)
                s = torch.tensor([time.perf_counter() - t0])
                dist.all_reduce(s, op=dist.ReduceOp.MAX)
                if r >= opts["warmup"]:
                    times[v][what].append(s.item())
            dist.barrier()
    return {"times": {v: {w: statistics.median(t) for w, t in d.items()} for v, d in times.items()},
            "once": sum(math.prod(s) for s in param_shapes(cfg).values()) * 4 * 3}


def on_disk(path: str) -> tuple[int, int]:
    """(bytes of the folder's files, tensor payload bytes the DCP index lists)."""
    files = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
    payload = sum(math.prod(size) * ELEMENT.get(e["dtype"], 4)
                  for fqn, e in dcp.tensor_index(path).items()
                  if e["shape"] is not None and not fqn.startswith(("rng.", "train."))
                  for _, size in e["chunks"])
    return files, payload


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="partui bench checkpoint", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small", help="preset (tiny, small, medium, large)")
    ap.add_argument("--plans", default=",".join(PLANS), help=f"of {', '.join(PLANS)}")
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds (each variant once)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    plans = [p for p in args.plans.split(",") if p]
    bad = [p for p in plans if p not in PLANS]
    if bad or not plans or args.rounds < 1 or args.warmup < 0:
        print(f"partui bench checkpoint: --plans {args.plans!r} must name some of "
              f"{', '.join(PLANS)}; --rounds >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    root = tempfile.mkdtemp(prefix="partui-bench-ckpt-")
    try:
        opts = {"model": args.model, "plans": plans, "rounds": args.rounds,
                "warmup": args.warmup, "root": root}
        r = run_world(2, _rank_main, opts, timeout_s=args.timeout, what="checkpoint world")[0]
        rows = []
        for v, t in r["times"].items():
            files, payload = on_disk(os.path.join(root, f"{v}-{args.warmup}"))
            rows.append({"variant": v, "save_s": t["save"], "load_s": t["load"],
                         "disk_bytes": files, "payload": payload, "once": payload / r["once"]})
    except (RuntimeError, TimeoutError) as e:
        print(f"partui bench checkpoint: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    peer = next(x for x in rows if x["variant"] == "fsdp2")
    for x in rows:
        x["save/fsdp2"], x["load/fsdp2"] = x["save_s"] / peer["save_s"], x["load_s"] / peer["load_s"]
    cmd = "partui bench checkpoint " + " ".join(argv)
    if args.json:
        print(json.dumps({"model": args.model, "rows": rows, "command": cmd}))
    else:
        print(f"model {args.model}, world 2, median of {args.rounds} interleaved rounds (slowest "
              f"rank); once = payload / (params + AdamW m, v once over = {r['once']:,} bytes)")
        print(table(rows, list(rows[0])))
        print(f"   ·   {cmd}")
    return 0
