"""`partui whatif TRACE --recompute full`: from a trace recorded without recompute, what full
recompute would save and cost, per rank. Saved: the trace's measured activation peak (its memory
counters) less the formula's activations under recompute (kernels/memory_plan.py: in-flight
microbatches x each block's input). Cost: every block's forward runs again before its backward,
so the extra compute is the rank's recorded block forwards (spans "F block i") per step.
"""
from __future__ import annotations

import pandas as pd

from partui.analysis.memory import MIB, memory_samples


def block_forward_ms(doc: dict) -> dict[int, float]:
    """Per rank, its block forward spans' time per recorded step (ms)."""
    events = doc.get("traceEvents", [])
    steps = {e["args"].get("step") for e in events if e.get("ph") == "X" and e.get("cat") == "step"}
    total: dict[int, float] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("name", "").startswith("F block "):
            total[e["pid"]] = total.get(e["pid"], 0.0) + e.get("dur", 0.0) / 1e3
    return {r: t / max(1, len(steps)) for r, t in total.items()}


def step_ms(doc: dict) -> dict[int, float]:
    """Per rank, its mean step span (ms)."""
    per: dict[int, list] = {}
    for e in doc.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") == "step":
            per.setdefault(e["pid"], []).append(e["dur"] / 1e3)
    return {r: sum(v) / len(v) for r, v in per.items()}


def recompute_table(doc: dict, predicted: list[dict], path: str = "") -> pd.DataFrame:
    """Per rank: the measured activation peak, the formula's under full recompute, the bytes
    saved, and the extra compute. `predicted`: each rank's kernels.memory_plan.predict_rank
    under the trace's plan with recompute="full" (partui.layout.plan_layout)."""
    samples = memory_samples(doc, path)
    peaks = samples.groupby("rank")["activations"].max()
    extra, steps = block_forward_ms(doc), step_ms(doc)
    rows = []
    for rank, pred in enumerate(predicted):
        measured = int(peaks.get(rank, 0))
        after = pred["activations"]
        rows.append({"rank": rank, "activations_mib": measured / MIB,
                     "recompute_activations_mib": None if after is None else after / MIB,
                     "saved_mib": None if after is None else (measured - after) / MIB,
                     "extra_compute_ms": extra.get(rank, 0.0),
                     "extra_compute_pct": 100 * extra.get(rank, 0.0) / steps[rank]
                     if steps.get(rank) else None})
    return pd.DataFrame(rows)
