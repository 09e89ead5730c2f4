"""`partui bench whatif`: how well `partui whatif` predicts a `--link` run, per plan.

For each plan one world alternates windows of steps without the link and with it (World.set_link
between steps), so machine noise hits both alike; each plain window is replayed under the link
(partui.analysis.replay.whatif, the first step of a window left out as a warm-up) and set beside the
linked window that follows it. Reported per plan: predicted and measured step (slowest rank, mean
over a window's steps; then the median over the rounds, so one window hit by another job's burst
on this shared machine does not decide) and the error of the prediction.

With --explain, where the error comes from (per step, slowest rank, median over the windows):
    link_only_ms    the same plain window replayed by the link alone (whatif --link-only): the
                    prediction before a collective was held to gloo's recorded own time and a
                    wait kept its own time past its op's end, as the live emulation holds them
                    (partui.analysis.replay.whatif's module doc); link_only_error_pct its error against
                    the same measured step: predicted - link_only is what those rules add
    self_replay_ms  the linked window replayed under its own link: the prediction had it known
                    the linked run's own busy stretches, gloo times and wake-ups; measured -
                    self_replay is what the replay's rules still miss (p2p keeps the link's rule)
    busy_plain_ms / busy_link_ms   the replay's busy time (recorded time outside waits) of each
                    window: the compute the plain window measured vs what the linked run spent;
                    on a loaded machine their gap, not the model, decides error_pct
    equal_busy_error_pct   per round (predicted - measured + busy_link - busy_plain) / measured,
                    then the median: the error had both windows computed alike, the machine's
                    noise between them taken out (at load 2.4-3.7 it put --ep 2 --overlap at
                    -0.4% where error_pct read -6%)
    cpu_plain_ms / cpu_link_ms     the main thread's CPU time inside steps: busy time rising with
                    it is compute costing more CPU (cold caches after sleeping), not core sharing
    late_ms         time the linked window's waits returned after their op's recorded end (or
                    their own start): the wait's own time the replay keeps
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from partui.analysis import read_doc
from partui.analysis.replay.whatif import programs, steps_of
from partui.bench.args import whole_at_least_one
from partui.bench.harness import table
from partui.commands.whatif import measured_step_ms, predict
from partui.world.world import World
from planning.link import LinkModel, check_link
from planning.pipeline.catalog import specs

PLANS = {  # name: World.plan fields
    "dp2-zero2": {"dp": 2, "zero": 2},
    # the one-direction schedules with F&B pairs (1f1b, dualpipev), pp 2
    **{f"pp2-{s.name}": {"pp": 2, "schedule": s.name, "microbatches": 4}
       for s in specs(fb_overlap=True, mirrored=False)},
    "ep2": {"ep": 2, "experts": 4},
    "ep2-overlap": {"ep": 2, "experts": 4, "overlap": True},
}


def window(w: World, path: str, steps: int) -> dict:
    w.trace_on()
    w.step(steps)
    return read_doc(w.trace_save(path))


def _per_step(doc: dict, fn) -> float:
    """Mean over the kept steps of the slowest rank's fn(rank events of that step)."""
    ev = doc["traceEvents"]
    out = []
    for s in steps_of(doc):
        spans = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "step"
                 and e["args"].get("step") == s]
        out.append(max(fn([e for e in ev if e.get("ph") == "X" and e.get("pid") == sp["pid"]
                           and sp["ts"] <= e["ts"] <= sp["ts"] + sp["dur"]], sp) for sp in spans))
    return statistics.mean(out)


def busy_ms(doc: dict) -> float:
    per = [max(sum(it[1] for it in p["items"] if it[0] == "busy") / 1e6
               for p in programs(doc, s).values()) for s in steps_of(doc)]
    return statistics.mean(per)


def cpu_ms(doc: dict) -> float:
    return _per_step(doc, lambda _evs, sp: sp["args"].get("cpu_us", 0.0) / 1e3)


def late_ms(doc: dict) -> float:
    """Waits' return after max(their start, their op's recorded (modelled) end)."""
    ends = {(e["pid"], e["args"]["op_id"]): e["ts"] + e["dur"] for e in doc["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") == "comm" and "op_id" in (e.get("args") or {})
            and e["args"].get("op") != "send"}

    def late(evs, _sp):
        return sum(max(0.0, e["ts"] + e["dur"] - max(e["ts"], ends[e["pid"], e["args"]["op_id"]]))
                   for e in evs if e.get("cat") == "wait"
                   and (e["pid"], (e.get("args") or {}).get("op_id")) in ends) / 1e3
    return _per_step(doc, late)


def equal_busy_error_pct(predicted: float, measured: float, busy_plain: float,
                         busy_link: float) -> float:
    """The prediction's error had the linked window been as busy as the plain one it was
    predicted from: the linked window's extra busy time (another job's burst) taken out."""
    return 100 * (predicted - (measured - (busy_link - busy_plain))) / measured


def measure(name: str, link: str, rounds: int, steps: int, floor: bool, folder: str,
            explain: bool = False) -> dict:
    preds, meas, why = [], [], []
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
            if explain:
                why.append({"link_only_ms": predict(plain, model, 1.0, floor, link_only=True)
                            ["predicted_step_ms"].max(),
                            "self_replay_ms": predict(linked, model, 1.0, floor)
                            ["predicted_step_ms"].max(),
                            "busy_plain_ms": busy_ms(plain), "busy_link_ms": busy_ms(linked),
                            "cpu_plain_ms": cpu_ms(plain), "cpu_link_ms": cpu_ms(linked),
                            "late_ms": late_ms(linked)})
                why[-1]["equal_busy_error_pct"] = equal_busy_error_pct(
                    preds[-1], meas[-1], why[-1]["busy_plain_ms"], why[-1]["busy_link_ms"])
    p, m = statistics.median(preds), statistics.median(meas)
    row = {"plan": name, "predicted_step_ms": p, "measured_step_ms": m,
           "error_pct": 100 * (p - m) / m, "rounds": rounds}
    for k in (why[0] if why else {}):
        row[k] = statistics.median(w[k] for w in why)
    if why:
        row["link_only_error_pct"] = 100 * (row["link_only_ms"] - m) / m
    return row


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="partui bench whatif", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--link", default="alpha_us=2000,gbps=0.02")
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--rounds", type=whole_at_least_one("--rounds", 3), default=3, help="plain / linked window pairs")
    ap.add_argument("--steps", type=int, default=3, help="steps a window (the first: warm-up)")
    ap.add_argument("--floor", action="store_true", help="whatif --floor")
    ap.add_argument("--explain", action="store_true",
                    help="add where the error comes from (see above)")
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
        rows = [measure(n, a.link, a.rounds, a.steps, a.floor, folder, a.explain) for n in names]
    cols = ["plan", "predicted_step_ms", "measured_step_ms", "error_pct", "rounds"]
    if a.explain:
        cols += ["link_only_ms", "link_only_error_pct", "self_replay_ms", "busy_plain_ms",
                 "busy_link_ms", "equal_busy_error_pct", "cpu_plain_ms", "cpu_link_ms", "late_ms"]
    print(table(rows, cols))
    print(f"\nlink {a.link}; predicted: partui whatif on the window without the link"
          f"{' (--floor)' if a.floor else ''}; measured: the next window, under it.\n"
          f"command: partui bench whatif {' '.join(argv)}")
    return 0
