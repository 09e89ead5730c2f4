"""The routing observatory as a table: per step and MoE layer, the tokens each expert took (gathered
over ep and dp, once: kernels/ep/routing_load.py), their spread, drops, dead experts, the balance loss and
the selection bias. Read from a partui trace (its metadata carries the traced steps' figures) or
from `partui run --json` output (one step line a line)."""
from __future__ import annotations

import json
import math

import pandas as pd

from partui.analysis.table.events import TraceError
from partui.analysis.reading.reader import read_doc

PER_EXPERT_MAX = 16   # per-expert columns e0.. only while they fit a terminal


def routing_steps(path: str) -> dict[int, dict]:
    """{step: moe_layers} from a partui trace or a `partui run --json` log; TraceError when the
    file holds no routing figures."""
    try:
        doc = read_doc(path)
    except TraceError:
        doc = None                                    # not one JSON document: maybe JSON lines
    if isinstance(doc, dict) and "traceEvents" in doc:
        found = (doc.get("metadata") or {}).get("routing") or {}
    else:
        lines = [doc] if isinstance(doc, dict) else _json_lines(path)
        found = {ln["step"]: ln["moe_layers"] for ln in lines
                 if isinstance(ln, dict) and "moe_layers" in ln}
    if not found:
        raise TraceError(f"{path}: no routing figures (an MoE run's `partui run --json` output or "
                         f"`--trace` file has them: add --experts or --model deepseek-tiny)")
    return {int(k): v for k, v in sorted(found.items(), key=lambda kv: int(kv[0]))}


def _json_lines(path: str) -> list:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    raise TraceError(f"{path}: line {n} is not JSON; give a partui trace or "
                                     f"`partui run --json` output") from None
    return out


def routing_table(steps: dict[int, dict]) -> pd.DataFrame:
    """One row per (step, layer): tokens (choices that reached an expert), min / max / std of the
    tokens per expert, max_violation (max / mean - 1), dropped, dead (experts with no token),
    balance_loss, the bias range, then the tokens of each expert (up to PER_EXPERT_MAX)."""
    rows = []
    for step, layers in steps.items():
        for index, fig in sorted(layers.items(), key=lambda kv: int(kv[0])):
            tok = fig["tokens_per_expert"]
            mean = sum(tok) / len(tok)
            row = {"step": step, "layer": int(index), "tokens": sum(tok), "min": min(tok),
                   "max": max(tok), "std": math.sqrt(sum((n - mean) ** 2 for n in tok) / len(tok)),
                   "max_violation": fig["max_violation"], "dropped": fig["dropped"],
                   "dead": " ".join(map(str, fig["dead_experts"])) or "-",
                   "balance_loss": fig["balance_loss"],
                   "bias_min": min(fig["bias"]) if fig["bias"] else None,
                   "bias_max": max(fig["bias"]) if fig["bias"] else None}
            if len(tok) <= PER_EXPERT_MAX:
                row.update({f"e{i}": n for i, n in enumerate(tok)})
            rows.append(row)
    return pd.DataFrame(rows)
