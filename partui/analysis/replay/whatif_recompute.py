"""`partui whatif TRACE --recompute full|selective`: from a trace recorded without recompute, what
recompute would save and cost, per rank. Saved: the trace's measured activation peak (its memory
counters) less the formula's activations under recompute (kernels/memory_plan.py: in-flight
microbatches x what each block keeps: its input (full), or its matmul outputs and the norms'
inputs (selective)). Cost: the rank's recorded block forwards (spans "F block i") per step, times
the share of a block's forward the mode runs again (kernels.recompute.forward_share: all of it
under full; under selective the norms, Q K^T with the softmax, and SwiGLU's activation, by their
operation count against the block's).
"""
from __future__ import annotations

import pandas as pd

from partui.analysis.figures.definitions import defined
from partui.analysis.figures.memory import MIB, memory_samples

# per rank (defined in partui.analysis.figures.definitions, view "whatif --recompute")
COLUMNS = ("rank", "peak_activations_mib", "recompute_activations_mib", "saved_mib", "extra_compute_ms",
           "extra_compute_pct")


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


def recompute_table(doc: dict, predicted: list[dict], path: str = "",
                    share: float = 1.0) -> pd.DataFrame:
    """Per rank: the measured activation peak, the formula's under recompute, the bytes saved,
    and the extra compute. `predicted`: each rank's kernels.memory_plan.predict_rank under the
    trace's plan with the recompute mode (partui.world.layout.plan_layout); `share`: the part of a
    block forward the mode runs again (kernels.recompute.forward_share)."""
    samples = memory_samples(doc, path)
    peaks = samples.groupby("rank")["activations"].max()
    extra = {r: ms * share for r, ms in block_forward_ms(doc).items()}
    steps = step_ms(doc)
    rows = []
    for rank, pred in enumerate(predicted):
        measured = int(peaks.get(rank, 0))
        after = pred["activations"]
        rows.append({"rank": rank, "peak_activations_mib": measured / MIB,
                     "recompute_activations_mib": None if after is None else after / MIB,
                     "saved_mib": None if after is None else (measured - after) / MIB,
                     "extra_compute_ms": extra.get(rank, 0.0),
                     "extra_compute_pct": 100 * extra.get(rank, 0.0) / steps[rank]
                     if steps.get(rank) else None})
    return defined(pd.DataFrame(rows, columns=list(COLUMNS)))
