"""The single-process side of a checkpoint: whole tensors into the one-process model and the
`--check` reference, from a DCP folder (kernels/comm/dcp.load_full) or from the plain state dict
DCP's `dcp_to_torch_save` makes of one. One process holds the whole model here by design."""
from __future__ import annotations

import torch

from kernels.checkpoint.state import STATE_NAMES
from kernels.comm import dcp
from kernels.ep.deepseek_layer import selection_biases


def load_model(layers: list, params: dict, full: dict[str, torch.Tensor]) -> None:
    """Every param and buffer of a single-process model from whole tensors (fqn -> tensor)."""
    for name, prm in params.items():
        prm.data.copy_(full[f"model.{name}"])
    for b in selection_biases(layers):
        b["tensor"].copy_(full[f"model.{b['name']}"])


def load_optimizer(optimizer, params: dict, full: dict[str, torch.Tensor]) -> None:
    """A hand optimizer's per-param state (m, v, fp32 master) and step count."""
    optimizer.init_state(list(params.values()))
    for name, prm in params.items():
        for key, t in optimizer.state.get(prm.name, {}).items():
            t.copy_(full[f"optim.{name}.{STATE_NAMES[key]}"])
    optimizer.step_count = int(full["train.optimizer_step"])


def load_reference(ref, path: str) -> int:
    """kernels.check.Reference resumed from the checkpoint at `path`; returns its step."""
    full = dcp.load_full(path)
    load_model(ref.model.layers, ref.params, full)
    load_optimizer(ref.optimizer, ref.params, full)
    ref.step_count = int(full["train.step"])
    return ref.step_count
