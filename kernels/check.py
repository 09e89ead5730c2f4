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

import math

import torch

from kernels.data import global_batch
from kernels.ep.deepseek_layer import balance_biases
from kernels.model import build_model, reference_step
from kernels.optim import make_optimizer
from kernels.stats import StepStats
from planning.config import model_config_for


class Reference:
    """The whole model in one process, trained on the same global batches."""

    def __init__(self, plan, cfg, seed=0, optim="adamw", lr=None, weight_decay=None,
                 backward="hand", dtype=torch.float32):
        self.cfg = model_config_for(plan, cfg)
        self.seed, self.backward = seed, backward
        self.stats = StepStats()      # the MoE layers' routing figures, one step at a time
        self.model = build_model(self.cfg, seed, dtype, stats=self.stats)
        self.routing: dict = {}       # the last step's moe_layers figures (kernels/ep/routing_load.py)
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

    def rounding_noise(self, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What low precision does to this step's grads: `grads` (forward_backward's, in the
        reference's dtype) minus the same step in fp32 at the same params. The bf16 check holds a
        plan's error to a multiple of it: bf16's epsilon through each tensor's real reductions."""
        tensors = {n: p.data.float().clone() for n, p in self.params.items()}
        exact = build_model(self.cfg, self.seed, torch.float32, tensors=tensors)
        ids, targets = global_batch(self.cfg.batch, self.cfg.seq, self.cfg.vocab, self.seed,
                                    self.step_count)
        exact.zero_grad()
        reference_step(exact, ids, targets, 1, self.backward)
        return {n: grads[n].float() - p.grad for n, p in exact.params().items()}

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


def compare_pieces(pieces_by_rank: list[list[dict]], ref: dict[str, torch.Tensor],
                   noise: dict[str, torch.Tensor] | None = None) -> dict:
    """Every piece (grads or params) against the reference: the max abs error and where (a NaN or
    inf anywhere counts as an infinite error, never as a pass), the max per-tensor relative error
    ||got - want|| / ||want|| (L2 over one rank's pieces of a tensor whose reference is not all
    zero) and where, the names holding
    a non-finite value, and coverage. With `noise` (the reference's own rounding of each tensor,
    Reference.rounding_noise), also the max noise ratio: ||got - want|| / ||noise|| over the same
    elements, the plan's error in units of what rounding does to that tensor at that step."""
    covered = {n: torch.zeros(t.numel(), dtype=torch.bool) for n, t in ref.items()}
    max_abs, worst = 0.0, None
    sums: dict[tuple[int, str], list[float]] = {}   # (rank, name) -> sum diff^2, want^2, noise^2
    nonfinite: list[str] = []
    for rank, pieces in enumerate(pieces_by_rank):
        for pc in pieces:
            name = pc["name"]
            if name not in ref:
                raise KeyError(f"rank {rank} reports a gradient for unknown parameter {name!r}")
            want = region(ref[name], pc["kind"], pc["index"]).double()
            got = pc["tensor"].double().reshape(want.shape)
            if not (bool(torch.isfinite(got).all()) and bool(torch.isfinite(want).all())):
                nonfinite.append(f"{name} on rank {rank}")
            diff = got - want
            err = diff.abs().max().item() if got.numel() else 0.0
            err = err if math.isfinite(err) else math.inf         # NaN -> inf: never below a bound
            if err > max_abs:
                max_abs, worst = err, f"{name} on rank {rank}"
            acc = sums.setdefault((rank, name), [0.0, 0.0, 0.0])
            acc[0] += float(diff.pow(2).sum())
            acc[1] += float(want.pow(2).sum())
            if noise is not None:
                acc[2] += float(region(noise[name], pc["kind"], pc["index"]).double().pow(2).sum())
            idx = torch.arange(ref[name].numel()).reshape(ref[name].shape)
            covered[name][region(idx, pc["kind"], pc["index"]).reshape(-1)] = True
    out = {"max_abs_err": max_abs, "worst": worst, "nonfinite": nonfinite,
           "missing": [n for n, c in covered.items() if not bool(c.all())]}
    # a tensor whose reference is all zero has no relative error: the absolute bound holds it
    rel = {key: ratio(d2, w2) for key, (d2, w2, _) in sums.items() if w2 > 0.0 or not math.isfinite(d2)}
    out["max_rel_err"], out["worst_rel"] = _worst(rel)
    if noise is not None:
        out["max_noise_ratio"], out["worst_noise"] = _worst(
            {key: ratio(d2, n2 + (NOISE_FLOOR ** 2) * w2) for key, (d2, w2, n2) in sums.items()})
    return out


NOISE_FLOOR = 2.0 ** -10   # of a tensor's norm: the least rounding noise taken (a quarter of bf16's eps)


def _worst(values: dict[tuple[int, str], float]) -> tuple[float, str | None]:
    if not values:
        return 0.0, None
    (rank, name), v = max(values.items(), key=lambda kv: kv[1])
    return v, f"{name} on rank {rank}"


def ratio(num_sq: float, den_sq: float) -> float:
    """sqrt(num_sq / den_sq): 0 when both are 0; inf for any error against 0 and for NaN."""
    if not math.isfinite(num_sq):
        return math.inf
    if den_sq == 0.0:
        return 0.0 if num_sq == 0.0 else math.inf
    return math.sqrt(num_sq / den_sq)
