"""`partui bench soak`: a long run's memory. Steps a world (default dp 4, 1,000 steps) and reads the
resident set (Rss of /proc/PID/smaps_rollup) of the controller and of every rank at step 100 and at
the end; the target is growth under 2% each (the controller keeps every rank's row and ledger for the
newest step only). Prints a table and the growth; exit 1 above --max-growth."""
from __future__ import annotations

import argparse
import json
import os

from partui.world import World


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


def soak(dp: int, steps: int, start: int) -> dict:
    """RSS (KiB) of the controller and each rank at step `start` and after `steps`, and the bytes
    of the controller's step history (as JSON) per step."""
    marks = {}
    with World(timeout_s=300) as w:
        w.plan("dp", dp=dp)
        w.launch()
        for i in range(1, steps + 1):
            w.step(1)
            if i in (start, steps):
                marks[i] = [rss_kib(os.getpid())] + [rss_kib(p) for p in w.pids()]
        history = sum(len(json.dumps(ln)) for ln in w.history) / len(w.history)
    names = ["controller"] + [f"rank {r}" for r in range(dp)]
    growth = [100.0 * (b - a) / a for a, b in zip(marks[start], marks[steps])]
    return {"rows": list(zip(names, marks[start], marks[steps], growth)),
            "history_bytes_per_step": history}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="partui bench soak", description=__doc__)
    ap.add_argument("--dp", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--from-step", type=int, default=100, help="the step growth is measured from")
    ap.add_argument("--max-growth", type=float, default=2.0, help="percent; exit 1 above it")
    args = ap.parse_args(argv)
    if not 1 <= args.from_step < args.steps:
        ap.error(f"--from-step {args.from_step} must be in 1..{args.steps - 1}: try --from-step 100")
    out = soak(args.dp, args.steps, args.from_step)
    print(f"{'process':<12}{'RSS KiB @' + str(args.from_step):>16}{'RSS KiB @' + str(args.steps):>16}"
          f"{'growth %':>10}")
    for name, a, b, g in out["rows"]:
        print(f"{name:<12}{a:>16}{b:>16}{g:>10.2f}")
    print(f"step history: {out['history_bytes_per_step']:.0f} bytes a step (as JSON)")
    return 1 if max(g for *_, g in out["rows"]) > args.max_growth else 0


if __name__ == "__main__":
    raise SystemExit(main())
