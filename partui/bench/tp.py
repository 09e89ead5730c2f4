"""`partui bench tp`: partui's hand-written tensor parallel against torch DTensor TP.

The peer is torch's `parallelize_module` with ColwiseParallel (wq, wk, wv, w1, w3, and the
lm_head, logits gathered) and RowwiseParallel (wo, w2, and the vocab-sharded embedding) on an
nn.Module Llama of the same shapes and the same initial weights, trained with torch's AdamW.
Both run in the same gloo world, steps interleaved (ours, DTensor, ours, ...) so machine load
hits them alike; a step is forward, backward and the optimizer, timed on every rank, the
slowest rank counts. The first step's losses are compared to show it is the same model.

DTensor's attention infers the local head count from the sharded projection (`view(b, s, -1,
head_dim)`), so with tp > kv heads its K/V shard is smaller than one head and it fails; the
failure is caught and reported (partui replicates such kv heads instead).
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

from kernels.data import global_batch
from kernels.engine import Engine
from kernels.weights import init_params
from partui.world import launch
from partui.world.plans import MODEL_FIELDS, build_plan


def parse(argv):
    ap = argparse.ArgumentParser(prog="partui bench tp", description=__doc__.splitlines()[0])
    ap.add_argument("--tp", default="2,4", help="comma list of tp sizes (world = tp)")
    ap.add_argument("--model", default="tiny")
    for name in ("layers", "dim", "heads", "kv-heads", "seq", "batch", "vocab"):
        ap.add_argument(f"--{name}", type=int, default=None)
    ap.add_argument("--steps", type=int, default=8, help="measured steps per implementation")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--sp", action="store_true", help="ours with sequence parallel too")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per world")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


# ---------------------------------------------------------------- the torch peer model

def torch_llama(cfg, tensors):
    """An nn.Module Llama with partui's shapes, names and initial weights (eager torch)."""
    class Norm(nn.Module):
        def __init__(self, w):
            super().__init__()
            self.weight = nn.Parameter(w.clone())

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.norm_eps) * self.weight

    def linear(w):
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
        lin.weight.data.copy_(w)
        return lin

    pos = torch.arange(cfg.seq, dtype=torch.float64)
    half = torch.arange(0, cfg.head_dim, 2, dtype=torch.float64)
    inv = 1.0 / cfg.rope_theta ** (half / cfg.head_dim)
    ang = torch.cat([pos[:, None] * inv, pos[:, None] * inv], -1)
    cos, sin = ang.cos().float(), ang.sin().float()               # [seq, head_dim]

    def rope(x):                                                   # [B, H, S, hd]
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    class Attn(nn.Module):
        def __init__(self, p):
            super().__init__()
            names = ("wq.weight", "wk.weight", "wv.weight", "wo.weight")
            self.wq, self.wk, self.wv, self.wo = (linear(tensors[p + n]) for n in names)

        def forward(self, x):
            b, s, _ = x.shape
            hd = cfg.head_dim   # local head counts follow from the (sharded) projections
            q = rope(self.wq(x).view(b, s, -1, hd).transpose(1, 2))  # [B, H, S, hd]
            k = rope(self.wk(x).view(b, s, -1, hd).transpose(1, 2))  # [B, KV, S, hd]
            v = self.wv(x).view(b, s, -1, hd).transpose(1, 2)
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(o.transpose(1, 2).reshape(b, s, -1))

    class Mlp(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.w1, self.w3, self.w2 = (linear(tensors[p + n]) for n in
                                         ("w1.weight", "w3.weight", "w2.weight"))

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self, i):
            super().__init__()
            p = f"layers.{i}."
            self.attn_norm, self.attn = Norm(tensors[p + "attn_norm.weight"]), Attn(p + "attn.")
            self.mlp_norm, self.mlp = Norm(tensors[p + "mlp_norm.weight"]), Mlp(p + "mlp.")

        def forward(self, x):
            h = x + self.attn(self.attn_norm(x))
            return h + self.mlp(self.mlp_norm(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(cfg.vocab, cfg.dim)
            self.embed.weight.data.copy_(tensors["embed.weight"])
            self.layers = nn.ModuleList(Block(i) for i in range(cfg.layers))
            self.norm = Norm(tensors["norm.weight"])
            self.lm_head = linear(tensors["lm_head.weight"])

        def forward(self, ids, targets):
            x = self.embed(ids)
            for blk in self.layers:
                x = blk(x)
            logits = self.lm_head(self.norm(x))
            return F.cross_entropy(logits.reshape(-1, cfg.vocab).float(), targets.reshape(-1))

    return Llama()


def dtensor_parallelize(model, cfg, world):
    """torch's own TP: ColwiseParallel / RowwiseParallel over a 1-D mesh of the world."""
    # lazy: torch's DTensor TP is a heavy extra, loaded only inside the bench's ranks
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (world,))
    plan = {"embed": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(cfg.layers):
        p = f"layers.{i}."
        plan.update({p + "attn.wq": ColwiseParallel(), p + "attn.wk": ColwiseParallel(),
                     p + "attn.wv": ColwiseParallel(), p + "attn.wo": RowwiseParallel(),
                     p + "mlp.w1": ColwiseParallel(), p + "mlp.w3": ColwiseParallel(),
                     p + "mlp.w2": RowwiseParallel()})
    return parallelize_module(model, mesh, plan)


# ---------------------------------------------------------------- one world

def _rank_rows(rank, world, opts) -> dict:
    """(step ms, loss) per step of ours and DTensor on this rank, inside the forked gloo world."""
    plan, cfg = build_plan("tp", opts["model"], opts["overrides"], tp=world)
    ours = {"ours": Engine(plan, cfg, rank, seed=0)}
    if opts["sp"]:
        sp_plan, _ = build_plan("tp-sp", opts["model"], opts["overrides"], tp=world)
        ours["ours sp"] = Engine(sp_plan, cfg, rank, seed=0, groups=ours["ours"].ctx.groups)
    rows = {name: [] for name in [*ours, "dtensor"]}
    error = None
    try:
        peer = dtensor_parallelize(torch_llama(cfg, init_params(cfg, 0)), cfg, world)
        optim = torch.optim.AdamW(peer.parameters(), lr=1e-3, weight_decay=0.0)
    except Exception as e:  # noqa: BLE001 - reported as the peer's result
        error = f"{type(e).__name__}: {e}"
    for step in range(opts["warmup"] + opts["steps"]):
        for name, eng in ours.items():
            res = eng.step()
            rows[name].append((res.step_ms, res.loss))
        if error is None:
            ids, targets = global_batch(cfg.batch, cfg.seq, cfg.vocab, 0, step)
            t0 = time.perf_counter()
            try:
                loss = peer(ids, targets)
                loss.backward()
                optim.step()
                optim.zero_grad(set_to_none=True)
                rows["dtensor"].append(((time.perf_counter() - t0) * 1e3, loss.item()))
            except Exception as e:  # noqa: BLE001 - every rank fails at the same view
                error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return {"rows": rows, "dtensor_error": error}


def summarise(per_rank: dict[int, dict], warmup: int) -> dict:
    """Median over measured steps of the slowest rank's step time, per implementation."""
    out = {"dtensor_error": per_rank[0]["dtensor_error"]}
    for name, rows in per_rank[0]["rows"].items():
        n = len(rows)
        if n <= warmup:
            out[name] = None
            continue
        steps = [max(per_rank[r]["rows"][name][i][0] for r in per_rank) for i in range(warmup, n)]
        out[name] = {"step_ms": statistics.median(steps), "first_loss": rows[0][1]}
    return out


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        sizes = [int(t) for t in args.tp.split(",") if t.strip()]
        if not sizes or min(sizes) < 2:
            raise ValueError
    except ValueError:
        print(f"partui bench tp: --tp {args.tp!r} must be a comma list of sizes >= 2, e.g. 2,4",
              file=sys.stderr)
        return 2
    given = {k: getattr(args, k, None) for k in MODEL_FIELDS}    # its flags are the sizes only
    overrides = {k: v for k, v in given.items() if v is not None}
    try:
        for n in sizes:
            _, cfg = build_plan("custom", args.model, overrides, tp=n, sp=args.sp)
    except ValueError as e:               # PlanError too
        print(f"partui bench tp: {e}", file=sys.stderr)
        return 2
    opts = {"model": args.model, "overrides": overrides, "steps": args.steps,
            "warmup": args.warmup, "sp": args.sp}
    table = []
    for n in sizes:
        try:
            per_rank = launch.run_world(
                n, _rank_rows, opts, timeout_s=args.timeout, what=f"tp {n} world",
                fix="try fewer --steps, a smaller model or a larger --timeout")
            res = summarise(dict(enumerate(per_rank)), args.warmup)
        except (RuntimeError, TimeoutError) as e:
            print(f"partui bench tp: {e}", file=sys.stderr)
            return 1
        ours, peer = res["ours"], res["dtensor"]
        row = {"tp": n, "kv_heads": cfg.kv_heads, "kv": "sharded" if cfg.kv_heads % n == 0
               else "replicated", "ours_ms": ours["step_ms"],
               "ours_sp_ms": res["ours sp"]["step_ms"] if res.get("ours sp") else None,
               "dtensor_ms": peer["step_ms"] if peer else None,
               "ratio": ours["step_ms"] / peer["step_ms"] if peer else None,
               "loss_ours": ours["first_loss"],
               "loss_dtensor": peer["first_loss"] if peer else None,
               "dtensor_error": res["dtensor_error"]}
        table.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
    command = "partui bench tp " + " ".join(argv)
    if not args.json:
        print(f"model {args.model}: dim {cfg.dim}, {cfg.layers} layers, "
              f"{cfg.heads} heads / {cfg.kv_heads} kv, seq {cfg.seq}, batch {cfg.batch}, "
              f"vocab {cfg.vocab}; median of {args.steps} steps after {args.warmup} warm-up, "
              f"slowest rank; world = tp")
        print(f"{'tp':>3} {'kv':>11} {'ours ms':>9} {'ours sp':>9} {'DTensor ms':>11} "
              f"{'ours/DT':>8}  first losses (ours, DTensor)")
        for r in table:
            sp = f"{r['ours_sp_ms']:9.1f}" if r["ours_sp_ms"] else f"{'-':>9}"
            if r["dtensor_ms"] is None:
                print(f"{r['tp']:>3} {r['kv']:>11} {r['ours_ms']:9.1f} {sp} {'failed':>11} "
                      f"{'-':>8}  {r['loss_ours']:.5f}, -")
                print(f"      DTensor: {r['dtensor_error']}")
            else:
                print(f"{r['tp']:>3} {r['kv']:>11} {r['ours_ms']:9.1f} {sp} "
                      f"{r['dtensor_ms']:11.1f} {r['ratio']:7.2f}x  "
                      f"{r['loss_ours']:.5f}, {r['loss_dtensor']:.5f}")
        print(f"command: {command.strip()}")
    return 0
