"""`partui bench soak`: a long run's memory. Steps a world (default dp 4, 1,000 steps) and reads the
resident set (Rss of /proc/PID/smaps_rollup) of the controller and of every rank at step 100 and at
the end; the target is growth under 2% each (the controller keeps its last step lines and running
totals, partui.world.world.HISTORY_LINES, not a line per step). Progress goes to stderr, a line every
~10% of steps; the table and one verdict line naming the target to stdout; exit 1 on a miss."""
from __future__ import annotations

import argparse
import json
import os
import sys

from partui.bench.args import whole_at_least_one
from partui.world.plans import build_plan
from partui.world.world import HISTORY_LINES, World


def rss_kib(pid: int) -> int:
    """Resident set size of a process in KiB: smaps_rollup's Rss, counted from the page tables when
    read (status's VmRSS is a per-CPU counter the kernel documents as approximate, off by up to a
    batch a CPU). VmRSS only where smaps_rollup is missing (kernels before 4.14)."""
    for name, key in (("smaps_rollup", "Rss:"), ("status", "VmRSS:")):
        try:
            with open(f"/proc/{pid}/{name}") as f:
                for line in f:
                    if line.startswith(key):
                        return int(line.split()[1])
        except FileNotFoundError:
            continue
    raise ValueError(f"no resident set size for pid {pid} in /proc")


def soak(dp: int, steps: int, start: int, history_lines: int = HISTORY_LINES,
         say=lambda text: None) -> dict:
    """RSS (KiB) of the controller and each rank at step `start` and after `steps`, the step lines
    the controller kept and their bytes (as JSON) a line; say(text) every ~10% of steps."""
    marks = {}
    every = max(1, steps // 10)
    with World(timeout_s=300, history_lines=history_lines) as w:
        w.plan("dp", dp=dp)
        w.launch()
        for i in range(1, steps + 1):
            w.step(1)
            if i in (start, steps):
                marks[i] = [rss_kib(os.getpid())] + [rss_kib(p) for p in w.pids()]
            if i % every == 0 or i == steps:
                say(f"soak: step {i}/{steps} · controller RSS {rss_kib(os.getpid())} KiB · "
                    f"{len(w.history)} step lines kept")
        kept = len(w.history)
        line_bytes = sum(len(json.dumps(ln)) for ln in w.history) / kept
    names = ["controller"] + [f"rank {r}" for r in range(dp)]
    growth = [100.0 * (b - a) / a for a, b in zip(marks[start], marks[steps])]
    return {"rows": list(zip(names, marks[start], marks[steps], growth)), "steps": steps,
            "start": start, "history_kept": kept, "history_lines": history_lines,
            "history_bytes_per_line": line_bytes}


def verdict(out: dict, max_growth: float) -> tuple[bool, str]:
    """Whether the soak met its target (no process's RSS grew more than max_growth %, the
    controller's kept step lines within their bound), and the one line that says so."""
    growth = {name: g for name, *_, g in out["rows"]}
    controller = growth.pop("controller")
    missed = [name for name, g in growth.items() if g > max_growth]
    ranks = f"ranks {min(growth.values()):+.1f}% .. {max(growth.values()):+.1f}%"
    if missed:
        ranks += f" ({', '.join(missed)} > {max_growth:g}%)"
    over_bound = out["history_kept"] > out["history_lines"]
    ok = controller <= max_growth and not missed and not over_bound
    return ok, (f"verdict: {'ok' if ok else 'FAILED'} — controller {controller:+.1f}%"
                + (f" > {max_growth:g}%" if controller > max_growth else "")
                + f", {ranks} over steps {out['start']}..{out['steps']} (target <= {max_growth:g}%); "
                f"{out['history_kept']} step lines kept"
                + (f" > their bound {out['history_lines']}" if over_bound
                   else f" (bound {out['history_lines']})"))


def growth_percent(text: str) -> float:
    """argparse type for --max-growth: a percentage above 0."""
    try:
        pct = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: e.g. --max-growth 2") from None
    if not pct > 0:
        raise argparse.ArgumentTypeError(f"{pct:g} must be above 0 (a percent): e.g. --max-growth 2")
    return pct


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="partui bench soak", description=__doc__)
    ap.add_argument("--dp", type=whole_at_least_one("--dp", 4), default=4)
    ap.add_argument("--steps", type=whole_at_least_one("--steps", 1000), default=1000)
    ap.add_argument("--from-step", type=whole_at_least_one("--from-step", 100), default=100,
                    help="the step growth is measured from")
    ap.add_argument("--max-growth", type=growth_percent, default=2.0, help="percent; exit 1 above it")
    ap.add_argument("--history-lines", type=whole_at_least_one("--history-lines", HISTORY_LINES),
                    default=HISTORY_LINES, help="step lines the controller keeps in full "
                    f"(World(history_lines=...), default {HISTORY_LINES}); the verdict checks the bound")
    args = ap.parse_args(argv)
    if args.from_step >= args.steps:
        ap.error(f"--from-step {args.from_step} must be in 1..{args.steps - 1}: "
                 f"try --from-step {max(1, args.steps // 10)} (or more --steps)")
    try:
        build_plan("dp", "tiny", {}, dp=args.dp)
    except ValueError as e:
        ap.error(f"--dp {args.dp}: {e}")
    out = soak(args.dp, args.steps, args.from_step, args.history_lines,
               say=lambda text: print(text, file=sys.stderr, flush=True))
    print(f"{'process':<12}{'RSS KiB @' + str(args.from_step):>16}{'RSS KiB @' + str(args.steps):>16}"
          f"{'growth %':>10}")
    for name, a, b, g in out["rows"]:
        print(f"{name:<12}{a:>16}{b:>16}{g:>10.2f}")
    print(f"step history: {out['history_kept']} lines kept of {args.steps} steps, "
          f"{out['history_bytes_per_line']:.0f} bytes a line (as JSON)")
    ok, line = verdict(out, args.max_growth)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
