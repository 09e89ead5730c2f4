"""The single-process reference a plan is held to, and the comparison of gathered pieces.

Each rank reports pieces of the full gradients: {name, kind: "slice" | "flat", index, tensor}
("slice": [[start, stop], ...] per dim, None for the whole tensor; "flat": [start, stop] into the
flattened tensor). Every piece is compared with the same region of the reference, and the pieces
of all ranks together must cover every element of every parameter.
"""
from __future__ import annotations

import torch

from kernels.data import global_batch
from kernels.engine import model_config_for
from kernels.model import build_model, reference_step
from kernels.optim import make_optimizer


class Reference:
    """The whole model in one process, trained on the same global batches."""

    def __init__(self, plan, cfg, seed=0, optim="adamw", lr=None, weight_decay=None,
                 backward="hand", dtype=torch.float32):
        self.cfg = model_config_for(plan, cfg)
        self.seed, self.backward = seed, backward
        self.model = build_model(self.cfg, seed, dtype)
        self.params = self.model.params()
        self.optimizer = make_optimizer(optim, lr, weight_decay)
        self.step_count = 0

    def step(self):
        """(loss, {name: full grad}) of the next step, then the optimizer update."""
        ids, targets = global_batch(self.cfg.batch, self.cfg.seq, self.cfg.vocab, self.seed,
                                    self.step_count)
        self.model.zero_grad()
        loss = reference_step(self.model, ids, targets, 1, self.backward)
        grads = {n: p.grad.clone() for n, p in self.params.items()}
        self.optimizer.step(list(self.params.values()))
        self.step_count += 1
        return float(loss), grads


def region(full: torch.Tensor, kind: str, index):
    if index is None:
        return full
    if kind == "flat":
        return full.reshape(-1)[index[0]:index[1]]
    return full[tuple(slice(a, b) for a, b in index)]


def compare_pieces(pieces_by_rank: list[list[dict]], ref: dict[str, torch.Tensor]) -> dict:
    """Max abs and max relative error of every piece against the reference, and coverage."""
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
    return {"max_abs_grad_err": max_abs, "worst": worst, "missing": missing}
