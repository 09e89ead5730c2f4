"""`partui bench pp`: our pipeline schedules against torch.distributed.pipelining on the same model.

One gloo world of pp ranks per world size runs both sides in the same processes, steps interleaved
(ours gpipe, torch GPipe, ours 1f1b, torch 1F1B, ...) so machine load hits them alike. The torch side is an
nn.Module Llama with the very weights of ours (the same seeded global init), cut into the same stages
(interleaved: rank r holds stages r and r+P; ZBV and DualPipeV: r and 2P-1-r), run with autograd by
ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B, ScheduleZBVZeroBubble and ScheduleDualPipeV. A step
is the whole training step on both sides: forward, backward, AdamW and the loss all-reduce; ms a step is the
median over rounds of the slowest rank (also its best step, the busiest rank's CPU time and all ranks' CPU
summed). Ours zb1p (one stage a rank) is set beside torch's ZBV (two).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from kernels import comm
from kernels.context import build_groups
from kernels.data import global_batch
from kernels.engine import Engine
from kernels.layers import rope_tables
from kernels.weights import init_params
from partui.world import launch
from partui.bench.args import whole_at_least_one
from partui.bench.harness import table
from partui.world.plans import build_plan
from planning.pipeline.catalog import CATALOG

# ours -> torch counterpart (class name in torch.distributed.pipelining), layout of the torch stages
PAIRS = [(s.name, *s.torch_peer) for s in CATALOG.values() if s.torch_peer]   # each record's peer


def parse(argv):
    ap = argparse.ArgumentParser(prog="partui bench pp", description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4", help="comma list of pp sizes (one world each)")
    ap.add_argument("--model", default="small", help="model preset (planning.config.PRESETS)")
    ap.add_argument("--layers", type=whole_at_least_one("--layers", 8), default=8)
    ap.add_argument("--microbatches", type=whole_at_least_one("--microbatches", 8), default=8, help="microbatches of one sequence each")
    ap.add_argument("--schedules", default=",".join(p[0] for p in PAIRS), help="comma list of ours")
    ap.add_argument("--rounds", type=whole_at_least_one("--rounds", 6), default=6, help="measured steps per schedule")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds for one world")
    ap.add_argument("--fb-order", default="forward-first", choices=("forward-first", "alternate"),
                    help="ours: how an overlapped F&B pair runs its two sides (kernels.pp.executor)")
    ap.add_argument("--recv-ahead", type=int, default=1, help="ours: computes whose RECVs are posted early")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


# ---------------------------------------------------------------- the torch model (same weights as ours)

def torch_stage_module(cfg, tensors, stage: int, stages: int):
    """An nn.Module of one pipeline stage: [embedding] blocks [norm, lm head], weights copied from ours."""
    cos, sin = rope_tables(torch.arange(cfg.seq), cfg.head_dim, cfg.rope_theta)  # [seq, head_dim]

    def rot(x):                                          # x [b, h, s, hd]
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def lin(name):
        m = nn.Linear(*reversed(tensors[name].shape), bias=False)
        m.weight.data.copy_(tensors[name])
        return m

    class Block(nn.Module):
        def __init__(self, i):
            super().__init__()
            p = f"layers.{i}."
            self.attn_norm, self.mlp_norm = nn.RMSNorm(cfg.dim, cfg.norm_eps), nn.RMSNorm(cfg.dim, cfg.norm_eps)
            self.wq, self.wk, self.wv, self.wo = (lin(p + f"attn.{w}.weight") for w in ("wq", "wk", "wv", "wo"))
            self.w1, self.w3, self.w2 = (lin(p + f"mlp.{w}.weight") for w in ("w1", "w3", "w2"))

        def forward(self, x):                            # x [b, s, dim]
            b, s, _ = x.shape
            heads = lambda t, n: t.view(b, s, n, cfg.head_dim).transpose(1, 2)  # noqa: E731 [b, n, s, hd]
            n = self.attn_norm(x)
            q, k = rot(heads(self.wq(n), cfg.heads)), rot(heads(self.wk(n), cfg.kv_heads))
            o = F.scaled_dot_product_attention(q, k, heads(self.wv(n), cfg.kv_heads), is_causal=True,
                                               enable_gqa=True)
            h = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
            n = self.mlp_norm(h)
            return h + self.w2(F.silu(self.w1(n)) * self.w3(n))

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            per = cfg.layers // stages
            self.embed = None
            if stage == 0:
                self.embed = nn.Embedding(cfg.vocab, cfg.dim)
                self.embed.weight.data.copy_(tensors["embed.weight"])
            self.blocks = nn.ModuleList(Block(i) for i in range(stage * per, (stage + 1) * per))
            self.head = None
            if stage == stages - 1:
                self.norm, self.head = nn.RMSNorm(cfg.dim, cfg.norm_eps), lin("lm_head.weight")

        def forward(self, x):
            x = self.embed(x) if self.embed is not None else x
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x)) if self.head is not None else x   # [b, s, vocab] on the last

    return Stage()


def torch_runner(cls_name: str, layout: str, cfg, tensors, rank: int, pp: int, m: int, denom: int):
    """A zero-argument step function for one torch schedule on this rank."""
    from torch.distributed import pipelining  # lazy: torch's pipelining is a heavy extra
    stage_ids = {"one": [rank], "loop": [rank, rank + pp], "v": [rank, 2 * pp - 1 - rank]}[layout]
    stages = pp if layout == "one" else 2 * pp
    mods = [torch_stage_module(cfg, tensors, s, stages) for s in stage_ids]
    pstages = [pipelining.PipelineStage(mod, s, stages, torch.device("cpu")) for mod, s in zip(mods, stage_ids)]
    loss_fn = lambda out, tgt: F.cross_entropy(out.reshape(-1, cfg.vocab), tgt.reshape(-1),  # noqa: E731
                                               reduction="sum") / denom       # partial losses sum to the loss
    cls = getattr(pipelining, cls_name)
    sched = cls(pstages[0] if layout == "one" else pstages, m, loss_fn=loss_fn, scale_grads=False)
    opt = torch.optim.AdamW([q for mod in mods for q in mod.parameters()], lr=1e-3)
    first, last = 0 in stage_ids, stages - 1 in stage_ids

    def step(ids, targets):
        opt.zero_grad()
        losses = []
        sched.step(*([ids] if first else []), target=targets if last else None, losses=losses)
        opt.step()
        loss = torch.tensor([float(sum(x.item() for x in losses))], dtype=torch.float64)
        comm.all_reduce(loss, comm.world_group())
        return loss.item()
    return step


# ---------------------------------------------------------------- one world

def _rank_times(rank, world, opts) -> dict:
    """Step ms (slowest rank) and first loss per schedule, ours and torch's, inside the forked world."""
    m = opts["microbatches"]
    model = {"layers": opts["layers"], "batch": m}
    base, cfg = build_plan("custom", opts["model"], model, pp=world, microbatches=m)
    denom = cfg.batch * cfg.seq
    groups = build_groups(base)
    tensors = init_params(cfg, 0)
    ids, targets = global_batch(cfg.batch, cfg.seq, cfg.vocab, 0, 0)
    fns = {}
    for ours, theirs, layout in PAIRS:
        if ours not in opts["schedules"]:
            continue
        plan, _ = build_plan("custom", opts["model"], model, pp=world, schedule=ours, microbatches=m)
        eng = Engine(plan, cfg, rank, seed=0, lr=1e-3, groups=groups)
        eng.runner.fb_order, eng.runner.recv_ahead = opts["fb_order"], opts["recv_ahead"]
        fns["ours " + ours] = lambda eng=eng: eng.step().loss
        step = torch_runner(theirs, layout, cfg, tensors, rank, world, m, denom)
        fns["torch " + theirs] = lambda step=step: step(ids, targets)
    times, first_loss = {k: [] for k in fns}, {}
    for r in range(opts["warmup"] + opts["rounds"]):
        for name, fn in fns.items():
            comm.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            loss = fn()
            cost = torch.tensor([(time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3])
            cpu_all = cost[1:].clone()
            comm.all_reduce(cost, comm.world_group(), op="max")      # the slowest rank's step
            comm.all_reduce(cpu_all, comm.world_group())             # every rank's CPU: with more ranks
            first_loss.setdefault(name, loss)                        # than cores, wall ~ this / cores
            if r >= opts["warmup"]:
                times[name].append(cost.tolist() + cpu_all.tolist())
    summary = {k: {"ms": statistics.median(t[0] for t in v), "min_ms": min(t[0] for t in v),
                   "cpu_ms": statistics.median(t[1] for t in v),
                   "cpu_all_ms": statistics.median(t[2] for t in v)} for k, v in times.items()}
    return {"ms": summary, "loss": first_loss}


def one_process_ms(opts: dict, rounds: int) -> float:
    """The same model and batch in this process, no pipeline: the floor a pipeline divides."""
    torch.set_num_threads(1)
    m = opts["microbatches"]
    plan, cfg = build_plan("single", opts["model"], {"layers": opts["layers"], "batch": m}, microbatches=m)
    eng = Engine(plan, cfg, 0, seed=0, lr=1e-3)
    eng.step()
    return statistics.median(eng.step().step_ms for _ in range(rounds))


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
        if not worlds or min(worlds) < 2:
            raise ValueError(f"--worlds {args.worlds}: pipeline worlds need 2 ranks or more, e.g. --worlds 2,4")
        chosen = [s.strip() for s in args.schedules.split(",") if s.strip()]
        known = [p[0] for p in PAIRS]
        if not chosen or any(s not in known for s in chosen):
            raise ValueError(f"--schedules {args.schedules}: pick from {', '.join(known)}")
        model = {"layers": args.layers, "batch": args.microbatches}
        for w in worlds:
            for s in chosen:
                _, cfg = build_plan("custom", args.model, model, pp=w, schedule=s,
                                    microbatches=args.microbatches)
                if cfg.layers % (2 * w):                        # torch's V and loop layouts use 2P stages
                    raise ValueError(f"{cfg.layers} layers do not split over 2 x pp {w} stages for torch's "
                                     f"two-stage-a-rank schedules: pick --layers a multiple of {2 * w}")
    except ValueError as e:
        print(f"partui bench pp: {e}", file=sys.stderr)
        return 2
    opts = {"model": args.model, "layers": args.layers, "microbatches": args.microbatches,
            "schedules": chosen, "rounds": args.rounds, "fb_order": args.fb_order,
            "recv_ahead": args.recv_ahead, "warmup": args.warmup}
    single = one_process_ms(opts, args.rounds)
    rows = []
    for w in worlds:
        try:
            res = launch.run_world(w, _rank_times, opts, timeout_s=args.timeout, what=f"pp {w} world",
                                      fix="try fewer --rounds or --schedules, or a larger --timeout")[0]
        except (RuntimeError, TimeoutError) as e:
            print(f"partui bench pp: {e}", file=sys.stderr)
            return 1
        for ours, theirs, _ in PAIRS:
            if ours in chosen:
                a, b = res["ms"]["ours " + ours], res["ms"]["torch " + theirs]
                rows.append({"world": w, "ours": ours, "ours_ms": a["ms"], "ours_min": a["min_ms"],
                             "ours_cpu": a["cpu_ms"], "torch": theirs, "torch_ms": b["ms"],
                             "torch_min": b["min_ms"], "torch_cpu": b["cpu_ms"], "ours/torch": a["ms"] / b["ms"],
                             "min ratio": a["min_ms"] / b["min_ms"],
                             "cpu_all ratio": a["cpu_all_ms"] / b["cpu_all_ms"],
                             "loss_ours": res["loss"]["ours " + ours], "loss_torch": res["loss"]["torch " + theirs]})
    command = "partui bench pp " + " ".join(argv)
    if args.json:
        print(json.dumps({"command": command, "one_process_ms": single, "rows": rows}))
        return 0
    print(f"{args.model} model, {args.layers} layers, {args.microbatches} microbatches of 1 sequence, "
          f"ms a training step (median of {args.rounds}, slowest rank), interleaved with torch's")
    print(table(rows, ["world", "ours", "ours_ms", "ours_min", "ours_cpu", "torch", "torch_ms", "torch_min",
                       "torch_cpu", "ours/torch", "min ratio", "cpu_all ratio", "loss_ours", "loss_torch"]))
    print("ms: median wall of the slowest rank; min: its best step; cpu: median process CPU ms of the busiest "
          "rank (gloo threads included), which a crowded machine inflates least; cpu_all: all ranks' CPU summed "
          "(with more ranks than cores, wall follows it)")
    print(f"one process, no pipeline: {single:.1f} ms a step")
    print(f"command: {command}")
    return 0
