"""The routing observatory's figures, per MoE layer per step, gathered once over the data-parallel
group (EP is carved out of it, so this is every token of the global batch) and never over tp: tp
ranks run the same MoE on the same tokens, so each already holds the whole figure.

Per layer: tokens_per_expert (choices that reached their expert after the all-to-all),
tokens_per_ep_rank (those summed over each EP rank's experts), chosen_per_expert (choices before
capacity drops: the load bias balancing reads), dropped (choices over capacity), max_violation
(max load / mean load - 1), balance_loss (GShard's aux loss or DeepSeek's sequence-wise loss),
bias (the selection bias this step routed with, DeepSeek only) and dead_experts (no token);
the arithmetic is planning/routing_figures.py. A collector of the rank's StepStats (kernels/stats.py).
"""
from __future__ import annotations

import torch

from kernels import comm
from kernels.comm import events
from planning.routing_figures import layer_figures, routing_totals


def token_groups(ctx) -> list:
    """The groups whose ranks route other tokens of the step through the same layers: dp (EP is
    carved out of it) and, under DualPipe, the mirror rank holding the same stages for the other
    direction's microbatches (looked up at each take: the pipeline runner makes that group later)."""
    return [g for g in (ctx.groups.get("dp"), ctx.groups.get("pp_mirror")) if g is not None]


class ExpertLoad:
    """This rank's routing counts in every MoE layer since the last `take()`; `take()` sums them
    over the groups `groups()` returns (every token of the step), one all-reduce each."""

    def __init__(self, groups=None, ep: int = 1):
        self.groups, self.ep = groups or (lambda: []), ep
        self.layers: dict[int, dict] = {}    # layer index -> counts of this rank's tokens

    def record(self, layer: int, kept: torch.Tensor, chosen: torch.Tensor, balance_loss: float,
               bias: torch.Tensor | None = None) -> None:
        """One forward of `layer` on a microbatch: choices kept per expert [E], chosen per expert
        [E], its partial balance loss, the bias it selected with."""
        s = self.layers.setdefault(layer, {"kept": torch.zeros_like(kept),
                                           "chosen": torch.zeros_like(chosen), "loss": 0.0,
                                           "bias": None if bias is None else bias.clone()})
        s["kept"] += kept
        s["chosen"] += chosen
        s["loss"] += balance_loss
        if events.recorder() is not None:
            events.counter(f"moe layer {layer} load", dropped=int((chosen - kept).sum()),
                           **{f"expert {e}": int(n) for e, n in enumerate(kept.tolist())})

    def take(self) -> dict:
        """moe_layers (index -> figures, gathered) and their moe_* totals; {} when no MoE ran."""
        if not self.layers:
            return {}
        order = sorted(self.layers)
        flat = torch.cat([torch.cat([self.layers[i]["kept"].double(),
                                     self.layers[i]["chosen"].double(),
                                     torch.tensor([self.layers[i]["loss"]], dtype=torch.float64)])
                          for i in order])                           # [layers * (2E + 1)]
        for group in self.groups():                                  # none: one process
            comm.all_reduce(flat, group)
        per = flat.view(len(order), -1)
        e = (per.shape[1] - 1) // 2
        biases = {i: (None if s["bias"] is None else s["bias"].tolist())
                  for i, s in self.layers.items()}
        out = {str(i): layer_figures(row[:e].tolist(), row[e:2 * e].tolist(), row[-1].item(),
                                     biases[i], self.ep)
               for i, row in zip(order, per)}
        self.layers.clear()
        return {"moe_layers": out, **routing_totals(out)}
