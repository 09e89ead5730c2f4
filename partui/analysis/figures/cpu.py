"""Core sharing, from the thread CPU time each compute span recorded (args.cpu_us): the time a rank
was runnable but had no core, told apart from the schedule's own bubble.

A rank's outermost compute spans (no compute span around them) cover its arithmetic; inside them,
outside its waits (where the thread sleeps), the thread either ran or was runnable and waiting
for a core. So per window: no_core = |outer spans minus waits| - their CPU time (never below 0).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.table.sweep import clip, sweep


def outermost(spans: pd.DataFrame) -> pd.DataFrame:
    """Spans not nested in an earlier one of their rank (sorted by rank, start, longest first)."""
    rank, ts, end = spans["rank"].to_numpy(), spans["ts"].to_numpy(), spans["end"].to_numpy()
    ties = (rank[1:] == rank[:-1]) & (ts[1:] <= ts[:-1])  # the table comes sorted by (rank, ts)
    order = np.lexsort((-spans["dur"].to_numpy(), ts, rank)) if ties.any() else np.arange(len(ts))
    rank, ts, end = rank[order], ts[order], end[order]
    prev_end = np.full(len(order), np.nan)  # the latest end before each span, within its rank
    cuts = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1], True])
    for a, b in zip(cuts[:-1], cuts[1:]):  # a loop per rank, vectorized inside
        prev_end[a + 1:b] = np.maximum.accumulate(end[a:b - 1])
    return spans.iloc[order[~(ts < prev_end)]]


def core_sharing(df: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame | None:
    """Per window (index wid): cpu (thread CPU time of the outermost compute spans) and no_core
    (their wall time outside waits, less that CPU time), in us; None without CPU times."""
    comp = df.loc[df["kind"] == "compute", ["rank", "ts", "end", "dur", "cpu_us"]]  # clip copies rows
    if not len(comp) or comp["cpu_us"].isna().all():
        return None
    outer = clip(outermost(comp[comp["cpu_us"].notna()]), windows)
    # a piece of a span cut by a window boundary keeps its share of the span's CPU time
    share = (outer["end"] - outer["ts"]) / outer["dur"].where(outer["dur"] > 0)
    outer = outer.assign(cpu=(outer["cpu_us"] * share.fillna(0.0)))
    waits = clip(df.loc[df["cat"] == "wait", ["rank", "ts", "end"]], windows)       # sleeping, not runnable (posting is CPU)
    key = np.concatenate([outer["wid"].to_numpy(), waits["wid"].to_numpy()])
    ts = np.concatenate([outer["ts"].to_numpy(), waits["ts"].to_numpy()])
    end = np.concatenate([outer["end"].to_numpy(), waits["end"].to_numpy()])
    cls = np.concatenate([np.zeros(len(outer), dtype=np.int64), np.full(len(waits), 2)])
    z = pd.DataFrame(0.0, index=windows["wid"].to_numpy(), columns=["cpu", "no_core"])
    if len(key):
        keys, lengths, _, _ = sweep(key, ts, end, cls, 3)
        running = pd.Series(lengths[:, 0], index=keys)
        cpu = outer.groupby("wid")["cpu"].sum()
        z.loc[cpu.index, "cpu"] = cpu.to_numpy()
        z.loc[keys, "no_core"] = np.maximum(0.0, running - z.loc[keys, "cpu"]).to_numpy()
    return z


def core_sharing_line(table: pd.DataFrame) -> str | None:
    """A report line: which of core sharing and the schedule's bubble held the ranks back more."""
    if "no_core_ms" not in table or table["no_core_ms"].isna().all():
        return None
    worst = table.loc[table["no_core_ms"].idxmax()]
    no_core = float(table["no_core_ms"].sum())
    line = (f"core sharing: rank {int(worst['rank'])} was runnable but not running for "
            f"{worst['no_core_ms']:.1f} ms (all ranks: {no_core:.1f} ms, compute spans' wall time "
            f"outside waits less their thread CPU time)")
    own = "sim_ideal_bubble_pct" if "sim_ideal_bubble_pct" in table else "sim_bubble_pct"
    if own in table and table[own].notna().any():
        schedule = float((table[own] / 100 * table["pipe_ms"]).sum())
        measured = float((table["pipe_bubble_pct"] / 100 * table["pipe_ms"]).sum())
        which = "core sharing dominates" if no_core > schedule else "the schedule's bubble dominates"
        line += (f"; pipeline bubble measured {measured:.1f} ms over all ranks, the schedule's own "
                 f"(simulated, mean F / B / W, comm free) {schedule:.1f} ms: {which}")
        if "sim_bubble_pct" in table and own != "sim_bubble_pct":
            replay = float((table["sim_bubble_pct"] / 100 * table["pipe_ms"]).sum())
            line += f"; replayed under the trace's own timing {replay:.1f} ms"
    return line
