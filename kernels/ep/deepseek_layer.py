"""DeepSeek-V3's MoE layer: GShard's phases (kernels/ep/layer.py: forward_dispatch /
forward_experts / forward_combine and the backward mirror) with DeepSeek's routing
(kernels/ep/deepseek.py), shared experts, and the selection bias as per-expert state.

The bias is state beside the parameters, not one of them: no gradient, no optimizer. Every rank
holds the whole vector [E] (each token is routed over every expert), and every rank updates it the
same way after a step from the step's load gathered over dp (kernels/ep/routing_load.py), so the copies
never diverge; `balance_biases` is that update, for the engine and the single-process reference.
"""
from __future__ import annotations

import torch

from kernels.ep.deepseek import bias_step, gate_backward_deepseek, route_deepseek
from kernels.ep.layer import MoE


class DeepSeekMoE(MoE):
    """Sigmoid affinities, group-limited top-k on affinity + bias, normalised gates x route scale,
    shared experts (set by kernels/ep/build.py), the sequence-wise balance loss, bias balancing."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.bias = torch.zeros(self.cfg.experts, dtype=torch.float32,
                                device=self.router.data.device)   # [E] selection only

    def route(self, logits):
        return route_deepseek(logits, self.bias, self.cfg, self.gs, self.global_groups)

    def gate_backward(self, r, dw):
        return gate_backward_deepseek(r, dw)

    def balance(self, chosen_per_expert: list[int]) -> None:
        """One step of auxiliary-loss-free balancing from the step's global load [E]."""
        if self.cfg.balance == "bias":
            load = torch.tensor(chosen_per_expert, dtype=torch.float32, device=self.bias.device)
            self.bias = bias_step(self.bias, load, self.cfg.bias_gamma)


def moe_layers_of(layers: list) -> list:
    """The MoE layers inside a list of stage layers (a Block's mlp)."""
    return [lay.mlp for lay in layers if getattr(getattr(lay, "mlp", None), "is_moe", False)]


def balance_biases(layers: list, moe_figures: dict) -> None:
    """After a step: every DeepSeek layer in `layers` moves its bias by the step's load
    (moe_figures: layer index -> the gathered figures of kernels/ep/routing_load.py)."""
    for moe in moe_layers_of(layers):
        fig = moe_figures.get(str(moe.index))
        if isinstance(moe, DeepSeekMoE) and fig is not None:
            moe.balance(fig["chosen_per_expert"])


def selection_biases(layers: list) -> list[dict]:
    """Every DeepSeek layer's selection bias in `layers`, as state beside the params: whole on every
    rank that holds the layer (routing any token needs every expert's bias)."""
    return [{"name": f"layers.{moe.index}.moe.selection_bias", "global_shape": list(moe.bias.shape),
             "tensor": moe.bias} for moe in moe_layers_of(layers) if isinstance(moe, DeepSeekMoE)]
