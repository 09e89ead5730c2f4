"""`partui bench whatif`: how well `partui whatif` predicts a `--link` run, per plan.

For each plan one world alternates windows of steps without the link and with it (World.set_link
between steps), so machine noise hits both alike; each plain window is replayed under the link
(partui.analysis.whatif, the first step of a window left out as a warm-up) and set beside the
linked window that follows it. Reported per plan: predicted and measured step (slowest rank, mean
over the windows' steps) and the error of the prediction.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from kernels.link import LinkModel, check_link
from partui.analysis import read_doc
from partui.bench.harness import table
from partui.commands.whatif import measured_step_ms, predict
from partui.session import World

PLANS = {  # name: World.plan fields
    "dp2-zero2": {"dp": 2, "zero": 2},
    "pp2-1f1b": {"pp": 2, "schedule": "1f1b", "microbatches": 4},
    "pp2-dualpipev": {"pp": 2, "schedule": "dualpipev", "microbatches": 4},
    "ep2": {"ep": 2, "experts": 4},
    "ep2-overlap": {"ep": 2, "experts": 4, "overlap": True},
}


def window(w: World, path: str, steps: int) -> dict:
    w.trace_on()
    w.step(steps)
    return read_doc(w.trace_save(path))


def measure(name: str, link: str, rounds: int, steps: int, floor: bool, folder: str) -> dict:
    preds, meas = [], []
    with World(timeout_s=600) as w:
        w.plan("custom", "tiny", **PLANS[name])
        w.launch()
        w.step(1)                                                # warm-up, not traced
        for k in range(rounds):
            w.set_link(None)
            plain = window(w, os.path.join(folder, f"{name}-{k}-plain.json"), steps)
            model = LinkModel.from_dict(w.set_link(link))
            linked = window(w, os.path.join(folder, f"{name}-{k}-link.json"), steps)
            preds.append(predict(plain, model, 1.0, floor)["predicted_step_ms"].max())
            meas.append(measured_step_ms(linked))
    p, m = statistics.mean(preds), statistics.mean(meas)
    return {"plan": name, "predicted_step_ms": p, "measured_step_ms": m,
            "error_pct": 100 * (p - m) / m, "rounds": rounds}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="partui bench whatif", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--link", default="alpha_us=2000,gbps=0.02")
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--rounds", type=int, default=3, help="plain / linked window pairs")
    ap.add_argument("--steps", type=int, default=3, help="steps a window (the first: warm-up)")
    ap.add_argument("--floor", action="store_true", help="whatif --floor")
    a = ap.parse_args(argv)
    names = a.plans.split(",")
    bad = [n for n in names if n not in PLANS]
    try:
        check_link(a.link, None, 2)
        if bad:
            raise ValueError(f"unknown plans {bad}: pick from {', '.join(PLANS)}")
        if a.rounds < 1 or a.steps < 2:
            raise ValueError("--rounds must be >= 1 and --steps >= 2 (the first step of a "
                             "window is a warm-up)")
    except ValueError as e:
        print(f"partui bench whatif: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as folder:
        rows = [measure(n, a.link, a.rounds, a.steps, a.floor, folder) for n in names]
    print(table(rows, ["plan", "predicted_step_ms", "measured_step_ms", "error_pct", "rounds"]))
    print(f"\nlink {a.link}; predicted: partui whatif on the window without the link"
          f"{' (--floor)' if a.floor else ''}; measured: the next window, under it.\n"
          f"command: partui bench whatif {' '.join(argv)}")
    return 0
