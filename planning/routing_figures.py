"""The routing observatory's arithmetic, torch-free (the step lines, `partui report` and the app read
it without torch): one layer's figures from its global counts, the totals over layers, and the
merge of every rank's layers into one step's (kernels/ep/routing_load.py gathers the counts).
"""
from __future__ import annotations


def layer_figures(kept: list, chosen: list, balance_loss: float, bias, ep: int) -> dict:
    """One layer's routing figures from its global counts [E] (kept, chosen)."""
    e = len(kept)
    total = sum(kept)
    mean = total / e
    local = e // ep
    return {"tokens_per_expert": [int(n) for n in kept],
            "tokens_per_ep_rank": [int(sum(kept[r * local:(r + 1) * local])) for r in range(ep)],
            "chosen_per_expert": [int(n) for n in chosen],
            "dropped": int(sum(chosen) - total),
            "max_violation": (max(kept) / mean - 1.0) if mean else 0.0,
            "balance_loss": float(balance_loss),
            "bias": [float(b) for b in bias] if bias is not None else None,
            "dead_experts": [i for i, n in enumerate(kept) if n == 0]}


def routing_totals(layers: dict) -> dict:
    """The moe_* step figures over every layer's figures (layer index -> figures)."""
    figs = list(layers.values())
    return {"moe_tokens_per_expert": [sum(col) for col in zip(*(f["tokens_per_expert"]
                                                                for f in figs))],
            "moe_dropped": sum(f["dropped"] for f in figs),
            "moe_aux_loss": sum(f["balance_loss"] for f in figs),
            "moe_max_violation": max(f["max_violation"] for f in figs),
            "moe_dead_experts": sum(len(f["dead_experts"]) for f in figs)}




def merge_layers(per_rank: list[dict]) -> dict:
    """One step's layer figures from every rank's (layer index -> figures): each layer once. Ranks
    holding the same layer (tp and dp replicas) hold the same gathered figures; pipeline stages
    hold different layers."""
    out: dict = {}
    for layers in per_rank:
        for index, fig in (layers or {}).items():
            out.setdefault(index, fig)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))
