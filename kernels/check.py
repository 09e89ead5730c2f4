"""The single-process reference a plan is held to, and the comparison of gathered pieces.

Each rank reports pieces of the full gradients: {name, kind: "slice" | "flat", index, tensor}
("slice": [[start, stop], ...] per dim, None for the whole tensor; "flat": [start, stop] into the
flattened tensor). Every piece is compared with the same region of the reference, and the pieces
of all ranks together must cover every element of every parameter.

Each step is checked at the plan's own state: the reference computes the step's loss and grads at
params equal to the plan's, then takes its optimizer step with the plan's (synced) grads, so the
params after the update are compared too (the sharded optimizers) and the next step starts from the
same params again. Trained apart, the two would drift: Adam's first updates turn fp32 noise in a
near-zero grad into a whole learning rate, and the next grads differ far above rounding.
"""
from __future__ import annotations

import torch

from kernels.config import model_config_for
from kernels.ep.deepseek_layer import balance_biases
from kernels.data import global_batch
from kernels.model import build_model, reference_step
from kernels.optim import make_optimizer
from kernels.stats import StepStats


class Reference:
    """The whole model in one process, trained on the same global batches."""

    def __init__(self, plan, cfg, seed=0, optim="adamw", lr=None, weight_decay=None,
                 backward="hand", dtype=torch.float32):
        self.cfg = model_config_for(plan, cfg)
        self.seed, self.backward = seed, backward
        self.stats = StepStats()      # the MoE layers' routing figures, one step at a time
        self.model = build_model(self.cfg, seed, dtype, stats=self.stats)
        self.routing: dict = {}       # the last step's moe_layers figures (kernels/ep/load.py)
        self.params = self.model.params()
        self.optimizer = make_optimizer(optim, lr, weight_decay)
        self.step_count = 0

    def forward_backward(self):
        """(loss, {name: full grad}) of the next step at the current params."""
        ids, targets = global_batch(self.cfg.batch, self.cfg.seq, self.cfg.vocab, self.seed,
                                    self.step_count)
        self.model.zero_grad()
        loss = reference_step(self.model, ids, targets, 1, self.backward)
        self.routing = self.stats.drain().get("moe_layers", {})
        return float(loss), {n: p.grad.clone() for n, p in self.params.items()}

    def update(self, grads: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The optimizer step, from `grads` (full tensors by name) when given, else from the reference's
        own; returns the params after it."""
        if grads is not None:
            for n, prm in self.params.items():
                prm.grad = grads[n].to(prm.data.dtype).clone()
        self.optimizer.step(list(self.params.values()))
        balance_biases(self.model.layers, self.routing)
        self.step_count += 1
        return {n: p.data for n, p in self.params.items()}

    def step(self):
        """(loss, {name: full grad}) of the next step, then the update from those grads."""
        loss, grads = self.forward_backward()
        self.update()
        return loss, grads


def assemble(pieces_by_rank: list[list[dict]], like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full tensors (shaped as `like`'s) from the ranks' pieces; coverage is compare_pieces' to check."""
    out = {n: torch.zeros_like(t) for n, t in like.items()}
    for pieces in pieces_by_rank:
        for pc in pieces:
            dst = region(out[pc["name"]], pc["kind"], pc["index"])
            dst.copy_(pc["tensor"].to(dst.dtype).reshape(dst.shape))
    return out


def region(full: torch.Tensor, kind: str, index):
    if index is None:
        return full
    if kind == "flat":
        return full.reshape(-1)[index[0]:index[1]]
    return full[tuple(slice(a, b) for a, b in index)]


def compare_pieces(pieces_by_rank: list[list[dict]], ref: dict[str, torch.Tensor]) -> dict:
    """Max abs error of every piece (grads or params) against the reference, the worst, and coverage."""
    covered = {n: torch.zeros(t.numel(), dtype=torch.bool) for n, t in ref.items()}
    max_abs, worst = 0.0, None
    for rank, pieces in enumerate(pieces_by_rank):
        for pc in pieces:
            name = pc["name"]
            if name not in ref:
                raise KeyError(f"rank {rank} reports a gradient for unknown parameter {name!r}")
            want = region(ref[name], pc["kind"], pc["index"])
            got = pc["tensor"].to(want.dtype).reshape(want.shape)
            err = (got - want).abs().max().item() if got.numel() else 0.0
            if err > max_abs:
                max_abs, worst = err, f"{name} on rank {rank}"
            idx = torch.arange(ref[name].numel()).reshape(ref[name].shape)
            covered[name][region(idx, pc["kind"], pc["index"]).reshape(-1)] = True
    missing = [n for n, c in covered.items() if not bool(c.all())]
    return {"max_abs_err": max_abs, "worst": worst, "missing": missing}
