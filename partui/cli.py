"""partui: the app (no arguments), and `run`, `report`, `simulate`, `bench` headless."""
from __future__ import annotations

import argparse
import importlib
import json
import sys

BENCHES = ("step", "launch", "dp", "tp", "pp", "cp", "ep", "collectives", "trace", "app")


def add_plan_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("plan")
    g.add_argument("--world", type=int, default=0, help="ranks (default: product of the dims)")
    g.add_argument("--dp", type=int, default=0, help="data-parallel ranks (0: derived)")
    g.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3")
    g.add_argument("--grad-sync", default=None, choices=("naive", "bucketed"))
    g.add_argument("--bucket-mb", type=float, default=None)
    g.add_argument("--tp", type=int, default=1)
    g.add_argument("--sp", action="store_true", help="sequence parallel (with --tp)")
    g.add_argument("--pp", type=int, default=1)
    g.add_argument("--schedule", default="1f1b")
    g.add_argument("--microbatches", type=int, default=1)
    g.add_argument("--virtual-stages", type=int, default=None)
    g.add_argument("--cp", type=int, default=1)
    g.add_argument("--cp-mode", default="ring")
    g.add_argument("--ep", type=int, default=1)
    g.add_argument("--experts", type=int, default=0)
    g.add_argument("--top-k", type=int, default=2)
    g.add_argument("--capacity-factor", type=float, default=None)
    g.add_argument("--overlap", action="store_true", help="EP: overlap all-to-all with compute")
    g.add_argument("--ep-dispatch", default="uneven", choices=("uneven", "even"),
                   help="EP all-to-all: uneven splits (counts exchanged first) or capacity-padded")
    g.add_argument("--dtype", default="fp32")
    g.add_argument("--collectives", default="native")
    m = p.add_argument_group("model")
    m.add_argument("--model", default="tiny")
    for name in ("layers", "dim", "heads", "kv-heads", "seq", "batch", "vocab"):
        m.add_argument(f"--{name}", type=int, default=None)
    t = p.add_argument_group("training")
    t.add_argument("--optim", default="adamw", choices=("adamw", "sgd"))
    t.add_argument("--backward", default="hand", choices=("hand", "autograd"))
    t.add_argument("--steps", type=int, default=5)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--weight-decay", type=float, default=None)


def plan_and_config(args):
    """(Plan, ModelConfig) validated; raises ValueError with the message to print."""
    from kernels.engine import model_config_for
    from kernels.mesh import Plan, validate
    from kernels.model import make_config
    if args.capacity_factor is not None and args.capacity_factor <= 0:
        raise ValueError(f"capacity factor {args.capacity_factor} must be > 0 "
                         f"(leave --capacity-factor out for no limit)")
    if getattr(args, "bucket_mb", None) is not None and args.bucket_mb <= 0:
        raise ValueError(f"bucket size {args.bucket_mb} MB must be > 0: try --bucket-mb 4")
    cfg = make_config(args.model, layers=args.layers, dim=args.dim, heads=args.heads,
                      kv_heads=args.kv_heads, seq=args.seq, batch=args.batch, vocab=args.vocab)
    kw = dict(world=args.world, dp=args.dp, zero=args.zero, tp=args.tp, sp=args.sp, pp=args.pp,
              schedule=args.schedule, microbatches=args.microbatches, cp=args.cp,
              cp_mode=args.cp_mode, ep=args.ep, experts=args.experts, top_k=args.top_k,
              capacity_factor=args.capacity_factor, overlap=args.overlap,
              ep_dispatch=args.ep_dispatch, dtype=args.dtype,
              collectives=args.collectives)
    for opt in ("grad_sync", "bucket_mb", "virtual_stages"):
        if getattr(args, opt, None) is not None:
            kw[opt] = getattr(args, opt)
    if kw["schedule"] == "interleaved" and "virtual_stages" not in kw:
        kw["virtual_stages"] = 2
    plan = Plan(**kw)
    plan = validate(plan, model_config_for(plan, cfg), args.world or None)
    model_parallel = [f"--{d} {getattr(plan, d)}" for d in ("pp", "cp", "ep")  # tp regions are autograd-aware
                      if getattr(plan, d) > 1] + (["--overlap"] if plan.overlap else [])
    if getattr(args, "backward", "hand") == "autograd" and model_parallel:
        raise ValueError(f"--backward autograd is the oracle for one replica's forward; with "
                         f"{' '.join(model_parallel)} the forward itself communicates, which "
                         f"autograd cannot see: drop --backward autograd (or those dims)")
    return plan, cfg


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="partui", description=__doc__)
    sub = ap.add_subparsers(dest="cmd")
    run = sub.add_parser("run", help="train headless on a gloo world (or under torchrun)")
    add_plan_args(run)
    run.add_argument("--json", action="store_true", help="one JSON object per step, then a summary")
    run.add_argument("--check", action="store_true",
                     help="compare loss and every gradient with the single-process reference")
    run.add_argument("--trace", default=None, help="record a Chrome trace to this path")
    run.add_argument("--trace-steps", default=None, help="steps to trace, e.g. 2:4 (default all)")
    run.add_argument("--trace-full", action="store_true", help="full viztracer (slow) not sparse")
    run.add_argument("--timeout", type=float, default=120.0, help="seconds any command may take")
    sub.add_parser("app", help="the terminal app (same as no arguments)")
    sub.add_parser("repl", help="a Python REPL holding a live world")
    bench = sub.add_parser("bench", help="benchmarks against torch built-ins")
    bench.add_argument("what", choices=BENCHES)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    for mod in ("partui.commands.report", "partui.commands.simulate"):
        try:
            importlib.import_module(mod).add_parser(sub)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.cmd in (None, "app"):
        from partui.app.main import main as app_main
        return app_main()
    if args.cmd == "repl":
        from partui.commands.repl import main as repl_main
        return repl_main()
    if args.cmd == "run":
        from partui.commands.run import run
        return run(args)
    if args.cmd == "bench":
        mod = importlib.import_module(f"partui.bench.{args.what}")
        return mod.main(args.rest)
    if args.cmd == "report":
        return importlib.import_module("partui.commands.report").run(args)
    if args.cmd == "simulate":
        return importlib.import_module("partui.commands.simulate").run(args)
    ap.print_help()
    return 2


def emit(obj, as_json: bool, text: str | None = None) -> None:
    print(json.dumps(obj) if as_json else (text or str(obj)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
