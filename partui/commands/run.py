"""`partui run`: train a plan headless, optionally checked against the reference and traced."""
from __future__ import annotations

import json
import os
import sys
import time

GRAD_ATOL = {"fp32": 2e-5, "bf16": 3e-2}   # max abs error of any gradient element
LOSS_ATOL = {"fp32": 2e-5, "bf16": 3e-2}
PARAM_ATOL = {"fp32": 1e-6, "bf16": 3e-2}  # after the update, both sides stepping from the same grads


def _fail(msg: str, code: int = 2) -> int:
    print(f"partui run: {msg}", file=sys.stderr)
    return code


def parse_steps(spec: str | None, steps: int) -> set[int]:
    if not spec:
        return set(range(steps))
    try:
        a, _, b = spec.partition(":")
        lo, hi = int(a or 0), int(b) if b else int(a) + 1
    except ValueError:
        raise ValueError(f"--trace-steps {spec!r} is not START:STOP (e.g. 2:4)")
    if not (0 <= lo < hi <= steps):
        raise ValueError(f"--trace-steps {spec!r} is outside steps 0..{steps}: pick START < STOP "
                         f"<= {steps}")
    return set(range(lo, hi))


def aggregate(step_items: list[dict]) -> dict:
    """One step line from every rank's summary: loss from rank 0, time of the slowest rank."""
    r0 = step_items[0]
    out = {"step": r0["step"], "loss": r0["loss"],
           "step_ms": max(s["step_ms"] for s in step_items),
           "ranks": [{k: round(s[k], 3) for k in ("step_ms", "compute_ms", "comm_ms",
                                                  "overlap_ms", "wait_ms")}
                     for s in step_items]}
    for key in ("grad_sync_overlap",):
        vals = [s[key] for s in step_items if key in s]
        if vals:
            out[key] = sum(vals) / len(vals)
    for key in ("attn_ms", "attn_cpu_ms", "attn_flops", "attn_overlap_pct"):  # cp load, per rank
        vals = [s[key] for s in step_items if key in s]
        if vals:
            out[key] = vals
    for key in ("moe_dropped", "moe_tokens_per_expert", "moe_aux_loss"):  # per-rank parts: summed
        vals = [s[key] for s in step_items if key in s]
        if vals:
            out[key] = (sum(vals) if not isinstance(vals[0], list)
                        else [sum(col) for col in zip(*vals)])
    return out


def run(args) -> int:
    from partui.cli import plan_and_config
    try:
        plan, cfg = plan_and_config(args)
        trace_steps = parse_steps(args.trace_steps, args.steps) if args.trace else set()
        if args.trace:
            _check_trace_path(args.trace)
    except ValueError as e:
        return _fail(str(e))
    from partui.world import under_torchrun
    if under_torchrun():
        from partui.torchrun import run_joined
        return run_joined(args, plan, cfg)
    from partui.world import Controller, RankError, WorldTimeout
    t0 = time.perf_counter()
    try:
        with Controller.launch(plan.world, timeout_s=args.timeout) as world:
            launch_s = time.perf_counter() - t0
            infos = world.setup(plan, cfg, seed=args.seed, optim=args.optim, lr=args.lr,
                                backward=args.backward, weight_decay=args.weight_decay)
            return _train(args, plan, cfg, world, infos, launch_s, trace_steps)
    except (RankError, WorldTimeout) as e:
        tb = getattr(e, "traceback", "")
        return _fail(f"{e}\n{tb}".rstrip(), 1)


def _check_trace_path(path: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise ValueError(f"--trace {path}: folder {d} does not exist; create it or pick another path")
    if not path.endswith((".json", ".json.gz")):
        raise ValueError(f"--trace {path}: name it .json or .json.gz")


def _train(args, plan, cfg, world, infos, launch_s, trace_steps) -> int:
    ref = None
    if args.check:
        from kernels.check import Reference
        import torch
        ref = Reference(plan, cfg, args.seed, args.optim, args.lr, args.weight_decay, "hand",
                        dtype=torch.bfloat16 if plan.dtype == "bf16" else torch.float32)
    failed, lines, traced = False, [], []
    tracing = False
    for step in range(args.steps):
        if step in trace_steps and not tracing:
            world.trace_start(sparse=not args.trace_full)
            tracing = True
        items = [r[0] for r in world.step(1, check=args.check)]
        line = aggregate(items)
        if tracing and step + 1 not in trace_steps:
            traced.append(world.trace_stop())
            tracing = False
        if ref is not None:
            failed = _check_step(ref, items, line, plan.dtype) or failed
        line["ledgers"] = [it.get("ledger") for it in items]
        lines.append(line)
        if args.json:
            print(json.dumps({k: v for k, v in line.items() if k != "ledgers"}), flush=True)
        else:
            extra = ""
            if ref is not None:
                extra = (f"  loss err {line['max_abs_loss_err']:.2e}  grad err {line['max_abs_grad_err']:.2e}"
                         f"  param err {line['max_abs_param_err']:.2e}"
                         + (f"  {line['check']}" if "check" in line else ""))
            print(f"step {line['step']:4d}  loss {line['loss']:.4f}  {line['step_ms']:8.1f} ms"
                  + extra, flush=True)
    trace_path = None
    if traced:
        trace_path = _save_trace(args, plan, cfg, world, infos, traced, trace_steps)
    summary = _summary(plan, cfg, infos, lines, launch_s, world, args, failed, trace_path)
    if args.json:
        print(json.dumps({"summary": summary}), flush=True)
    else:
        print(f"{plan.describe()} · world {plan.world} · {len(lines)} steps · final loss "
              f"{summary['final_loss']:.4f} · mean step {summary['mean_step_ms']:.1f} ms"
              + (f" · check {'FAILED' if failed else 'passed'}" if args.check else "")
              + (f" · trace {trace_path}" if trace_path else ""))
    return 1 if failed else 0


def _check_step(ref, items, line, dtype: str) -> bool:
    """One step against the reference, at the plan's own params (kernels.check): loss and grads, then the
    params after both sides update from the plan's grads. Fills `line`; True when it failed."""
    from kernels.check import assemble, compare_pieces
    grad_pieces = [it.pop("grad_pieces") for it in items]
    param_pieces = [it.pop("param_pieces") for it in items]
    ref_loss, ref_grads = ref.forward_backward()
    grads = compare_pieces(grad_pieces, ref_grads)
    params = compare_pieces(param_pieces, ref.update(assemble(grad_pieces, ref_grads)))
    line["ref_loss"] = ref_loss
    line["max_abs_loss_err"] = abs(line["loss"] - ref_loss)
    line["max_abs_grad_err"] = grads["max_abs_err"]
    line["max_abs_param_err"] = params["max_abs_err"]
    bad = [f"loss {line['max_abs_loss_err']:.2e} > {LOSS_ATOL[dtype]:g}"] \
        if line["max_abs_loss_err"] > LOSS_ATOL[dtype] else []
    for what, cmp, tol in (("grad", grads, GRAD_ATOL[dtype]), ("param", params, PARAM_ATOL[dtype])):
        if cmp["max_abs_err"] > tol:
            bad.append(f"{what} {cmp['max_abs_err']:.2e} > {tol:g} at {cmp['worst']}")
        if cmp["missing"]:
            line[f"missing_{what}s"] = cmp["missing"]
            bad.append(f"no rank reports all of the {what}s of {', '.join(cmp['missing'][:3])}")
    if bad:
        line["check"] = "FAILED (" + "; ".join(bad) + ")"
    return bool(bad)


def _save_trace(args, plan, cfg, world, infos, traced, trace_steps) -> str:
    import torch
    from partui.trace import merge
    per_rank = [dict() for _ in range(world.size)]
    for chunk in traced:               # one list per traced window, one entry per rank
        for r, ev in enumerate(chunk):
            if not per_rank[r]:
                per_rank[r] = ev
            else:
                per_rank[r]["events"] = per_rank[r].get("events", []) + ev.get("events", [])
    from partui.analysis.metrics import usable_cpus
    meta = {"plan": plan.to_dict(), "model": cfg.to_dict(), "torch": torch.__version__, "cpus": usable_cpus(),
            "steps": [min(trace_steps), max(trace_steps)], "ranks": [i["label"] for i in infos],
            "command": "partui run " + " ".join(sys.argv[2:])}
    return merge(per_rank, args.trace, meta)


def _summary(plan, cfg, infos, lines, launch_s, world, args, failed, trace_path) -> dict:
    times = [ln["step_ms"] for ln in lines[1:]] or [ln["step_ms"] for ln in lines]
    from kernels.engine import model_config_for
    out = {"plan": plan.to_dict(), "model": model_config_for(plan, cfg).to_dict(),
           "world": plan.world,
           "steps": len(lines), "final_loss": lines[-1]["loss"] if lines else None,
           "first_loss": lines[0]["loss"] if lines else None,
           "mean_step_ms": sum(times) / len(times) if times else None,
           "launch_s": round(launch_s, 3),
           "ranks": [{"rank": i["rank"], "label": i["label"], "role": i["role"],
                      "ledger": (lines[-1]["ledgers"][i["rank"]] if lines else i["ledger"])}
                     for i in infos]}
    if args.check:
        out["check"] = "failed" if failed else "passed"
        out["max_abs_grad_err"] = max(ln["max_abs_grad_err"] for ln in lines)
        out["max_abs_loss_err"] = max(ln["max_abs_loss_err"] for ln in lines)
        out["max_abs_param_err"] = max(ln["max_abs_param_err"] for ln in lines)
    if any("grad_sync_overlap" in ln for ln in lines):
        vals = [ln["grad_sync_overlap"] for ln in lines if "grad_sync_overlap" in ln]
        out["grad_sync_overlap"] = sum(vals) / len(vals)
    for key in ("attn_ms", "attn_cpu_ms", "attn_flops", "attn_overlap_pct"):
        rows = [ln[key] for ln in lines[1:] or lines if key in ln]
        if rows:  # per rank, mean over steps (context-parallel load balance)
            out[key] = [sum(col) / len(col) for col in zip(*rows)]
    if "attn_cpu_ms" in out and min(out["attn_cpu_ms"]) > 0:
        out["attn_cpu_max_over_min"] = max(out["attn_cpu_ms"]) / min(out["attn_cpu_ms"])
    if trace_path:
        out["trace"] = trace_path
    return out
