"""`partui report TRACE --memory`: each rank's memory account from a partui trace's counter
tracks (kernels/memory.py emits one "memory" counter, an arg per kind, at every change while a
trace records): the peak, the action at it, each kind at that moment, and a stacked timeline PNG.
"""
from __future__ import annotations

import pandas as pd

from partui.analysis.table.events import TraceError
from partui.analysis.reading.reader import read_doc
from planning.memory_kinds import KINDS

MIB = 2 ** 20
PEAK_ACTION_CATS = ("F", "B", "W", "FB", "microbatch", "optimizer")  # spans that name the moment of a peak


def memory_samples(doc: dict, path: str = "") -> pd.DataFrame:
    """One row per counter sample: rank, ts (us) and bytes of each kind, in time order."""
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    rows = [{"rank": e["pid"], "ts": e["ts"], **{k: e["args"].get(k, 0) for k in KINDS}}
            for e in events if e.get("ph") == "C" and e.get("name") == "memory"]
    if not rows:
        raise TraceError(f"{path or 'the trace'}: no memory counters (a trace partui records "
                         f"carries them since the memory account); record one with "
                         f"`partui run ... --trace FILE`")
    df = pd.DataFrame(rows).sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)
    df["total"] = df[list(KINDS)].sum(axis=1)
    return df


def action_at(events: list, rank: int, ts: float) -> str:
    """The innermost action span (F / B / W / FB, microbatch, optimizer) of `rank` open at ts; else
    "after" the last one ended before it (a recv posted between actions); else "step"."""
    inside = after = None
    for e in events:
        if e.get("ph") != "X" or e.get("pid") != rank or e.get("cat") not in PEAK_ACTION_CATS:
            continue
        end = e["ts"] + e.get("dur", 0)
        if e["ts"] <= ts <= end and (inside is None or e.get("dur", 0) < inside.get("dur", 0)):
            inside = e
        elif end < ts and (after is None or end > after["ts"] + after.get("dur", 0)):
            after = e
    if inside is not None:
        return inside["name"]
    return f"after {after['name']}" if after is not None else "step"


def memory_table(path: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per rank: peak, the action at it, each kind then, in MiB; the samples behind it)."""
    doc = read_doc(path)
    samples = memory_samples(doc, path)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    rows = []
    for rank, s in samples.groupby("rank", sort=True):
        peak = s.loc[s["total"].idxmax()]
        rows.append({"rank": int(rank), "peak_mib": peak["total"] / MIB,
                     "peak_at": action_at(events, int(rank), peak["ts"]),
                     **{f"{k}_mib": peak[k] / MIB for k in KINDS}})
    return pd.DataFrame(rows), samples


def plot_memory(samples: pd.DataFrame, path: str) -> str:
    """Per rank, each kind stacked over time (ms from the trace's first sample), the peak marked."""
    import matplotlib  # lazy and optional: a heavy extra, only for --plot
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ranks = sorted(samples["rank"].unique())
    fig, axes = plt.subplots(len(ranks), 1, figsize=(12, 2.2 * len(ranks) + 1), sharex=True,
                             squeeze=False)
    t0 = samples["ts"].min()
    for ax, rank in zip(axes[:, 0], ranks):
        s = samples[samples["rank"] == rank]
        t = (s["ts"] - t0) / 1e3
        ax.stackplot(t, *[s[k] / MIB for k in KINDS], labels=KINDS, step="post")
        peak = s.loc[s["total"].idxmax()]
        ax.axvline((peak["ts"] - t0) / 1e3, color="black", linestyle="--", linewidth=0.8)
        ax.annotate(f"peak {peak['total'] / MIB:.2f} MiB", ((peak["ts"] - t0) / 1e3,
                    peak["total"] / MIB), fontsize=8)
        ax.set_ylabel(f"rank {rank}\nMiB")
    axes[0, 0].legend(loc="upper left", ncol=len(KINDS), fontsize=8, frameon=False)
    axes[-1, 0].set_xlabel("time (ms)")
    fig.suptitle("memory held by kind (bytes of live tensors, the rank's own account); "
                 "dashed: each rank's peak")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
