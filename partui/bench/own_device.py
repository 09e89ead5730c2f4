"""What a bench's measured step would be with one device per rank, and whether this machine's
shared cores, not the schedule, decided the measured one (`partui bench fb`, `partui bench ep`).

Each measured step's recorded trace (every rank's RankTracer.stop()) is replayed by `partui
whatif`'s core (partui.analysis.replay.whatif) under the bench's link, each rank's busy stretches cut to
the CPU time it got (whatif.on_own_cores): own_device_ms. core_share_pct is that share over all
ranks: 100 means every rank had a core whenever it had work; well below it, ranks queued for this
machine's cores (each other's, or other jobs'), and the measured step says more about the cores
than about the schedule.
"""
from __future__ import annotations

import os

from partui.analysis.replay.whatif import on_own_cores, programs, simulate
from partui.recording.tracefile import build_doc
from planning.link import LinkModel
from planning.mesh import Plan

CORES_DECIDE_SHARE_PCT = 80.0   # below it, waiting for a core is over a fifth of the ranks' busy time


def own_device(recorded: list[dict], plan: Plan, link: LinkModel | None) -> tuple[float | None, float]:
    """(own_device_ms, core_share_pct) of one step from every rank's recording (rank order).
    own_device_ms is None without a link: the replay costs comm by the link model only."""
    doc = build_doc(recorded, {"plan": plan.to_dict()})
    progs = on_own_cores(doc, programs(doc))
    busy = [sum(it[1] for it in p["items"] if it[0] == "busy") for p in progs.values()]
    wall = sum(b / p["core_share"] for b, p in zip(busy, progs.values()) if p["core_share"] > 0)
    share = 100.0 * sum(busy) / wall if wall else 100.0
    if link is None:
        return None, share
    return float(simulate(progs, link, plan=plan)[0]["predicted_step_ms"].max()), share


def cores_verdict(share_pct: float, world: int) -> str:
    """One plain sentence on who decided the measured steps, from the median core share."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    where = (f"{world} ranks on this machine's {cores} cores (load average {load:.1f}) had a core for "
             f"{share_pct:.0f}% of their busy time")
    if share_pct < CORES_DECIDE_SHARE_PCT:
        return (f"{where}: the shared cores, not the schedule, decide step_ms here; own_device_ms "
                f"is what the same steps would take with one device per rank")
    return f"{where}: the schedule, not core sharing, decides step_ms here"
