"""Expert load per step: tokens each expert kept, choices dropped for capacity, and the aux loss,
per MoE layer and summed; a collector of the rank's StepStats (kernels/stats.py)."""
from __future__ import annotations

import torch

from kernels.comm import events


class ExpertLoad:
    """Load of this rank's tokens in every MoE layer since the last `take()`."""

    def __init__(self):
        self.layers: dict[int, dict] = {}    # layer index -> {"tokens", "dropped", "aux"}

    def record(self, layer: int, tokens: torch.Tensor, dropped: int, aux: float) -> None:
        """One forward of `layer`: kept choices per expert [E], dropped choices, its partial
        aux loss."""
        s = self.layers.setdefault(layer, {"tokens": torch.zeros_like(tokens), "dropped": 0,
                                           "aux": 0.0})
        s["tokens"] += tokens
        s["dropped"] += dropped
        s["aux"] += aux
        if events.recorder() is not None:
            events.counter(f"moe layer {layer} load", dropped=dropped,
                           **{f"expert {e}": int(n) for e, n in enumerate(tokens.tolist())})

    def take(self) -> dict:
        """The moe_* step figures (nothing when no MoE layer ran), then start over."""
        if not self.layers:
            return {}
        per_layer = {str(i): {"tokens_per_expert": s["tokens"].tolist(), "dropped": s["dropped"],
                              "aux_loss": s["aux"]} for i, s in sorted(self.layers.items())}
        total = sum(s["tokens"] for s in self.layers.values())
        out = {"moe_tokens_per_expert": total.tolist(),
               "moe_dropped": sum(s["dropped"] for s in self.layers.values()),
               "moe_aux_loss": sum(s["aux"] for s in self.layers.values()), "moe_layers": per_layer}
        self.layers.clear()
        return out
