"""Hand-written optimizers over Params (dense tensors or ZeRO's flat shards); state in place.

AdamW follows torch.optim.AdamW's arithmetic order exactly (decoupled decay first, then the
bias-corrected update), so the two agree to rounding. Every update is elementwise, so running
it over ZeRO's flat fp32 shards (one Param per shard, see kernels/zero.py) gives bit-identical
results to the dense per-tensor update.

Mixed precision: a Param whose data is bf16 (or fp16) gets an fp32 `master` copy in its state;
the update runs on the master and the rounded result is written back, as in the ZeRO paper
(2 bytes params + 2 bytes grads + 12 bytes fp32 master, m and v for AdamW).
"""
from __future__ import annotations

import math

import torch

from kernels.comm import events
from kernels.layers import Param

LOW_PRECISION = (torch.bfloat16, torch.float16)


def adamw_update_(w, g, m, v, lr, b1, b2, eps, weight_decay, step, scratch=None) -> None:
    """One AdamW step on flat or shaped tensors, all in place: w, m, v updated.

    `scratch` (w's shape) holds the denominator; without it one is allocated. Reusing one
    matters for big flat buckets: a fresh multi-MB temporary is fresh pages every step."""
    bias1, bias2 = 1 - b1 ** step, 1 - b2 ** step
    w.mul_(1 - lr * weight_decay)
    m.lerp_(g, 1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    denom = torch.sqrt(v, out=scratch) if scratch is not None else v.sqrt()
    denom.div_(math.sqrt(bias2)).add_(eps)       # torch's order: sqrt(v) / sqrt(bias2) + eps
    w.addcdiv_(m, denom, value=-(lr / bias1))


def _master(prm: Param) -> dict:
    """fp32 master weights for a low-precision Param, else nothing."""
    if prm.data.dtype in LOW_PRECISION:
        return {"master": prm.data.detach().to(torch.float32).clone()}
    return {}


def _state_bytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for s in state.values() for t in s.values()
               if isinstance(t, torch.Tensor))


class Optimizer:
    """What SGD and AdamW share: a step counter and per-param state; a step is `begin_step` then
    `update` over each group of params (all at once, or bucket by bucket as grads get synced)."""

    def __init__(self, lr: float, weight_decay: float):
        self.lr, self.weight_decay = lr, weight_decay
        self.state: dict[str, dict] = {}
        self.scratch: dict = {}       # dtype -> a reused working buffer (AdamW's denominator)
        self.step_count = 0

    def scratch_bytes(self) -> int:
        """Reused working buffers held between steps (not state: the memory account's workspace)."""
        return sum(t.numel() * t.element_size() for t in self.scratch.values())

    def step(self, params: list[Param]) -> None:
        self.begin_step()
        self.update(params)

    def begin_step(self) -> None:
        """Count a new step (AdamW's bias correction uses it)."""
        self.step_count += 1

    def update(self, params: list[Param]) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    def __init__(self, lr: float = 0.1, weight_decay: float = 0.0):
        super().__init__(lr, weight_decay)

    def init_state(self, params: list[Param]) -> None:
        for prm in params:
            if prm.name not in self.state and prm.data.dtype in LOW_PRECISION:
                self.state[prm.name] = _master(prm)

    def update(self, params: list[Param]) -> None:
        """This step's update of some params (call once per param per step)."""
        self.init_state(params)
        with events.span("sgd", "optimizer", step=self.step_count):
            for prm in params:
                if prm.grad is None:
                    continue
                st = self.state.get(prm.name, {})
                w = st.get("master", prm.data)
                if self.weight_decay:
                    w.mul_(1 - self.lr * self.weight_decay)
                w.add_(prm.grad.to(w.dtype), alpha=-self.lr)
                if "master" in st:
                    prm.data.copy_(w)

    def state_bytes(self) -> int:
        return _state_bytes(self.state)

    def bytes_per_element(self, dtype) -> int:
        """Optimizer state bytes per parameter element (the ZeRO paper's K)."""
        return 4 if dtype in LOW_PRECISION else 0


class AdamW(Optimizer):
    """m, v per parameter (fp32; plus an fp32 master for bf16 params), one shared step count."""

    def __init__(self, lr: float = 1e-3, betas=(0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(lr, weight_decay)
        self.betas, self.eps = betas, eps

    def _scratch_like(self, w: torch.Tensor) -> torch.Tensor:
        """A reused buffer of w's shape (one per dtype, as big as the biggest tensor seen)."""
        buf = self.scratch.get(w.dtype)
        if buf is None or buf.numel() < w.numel():
            buf = self.scratch[w.dtype] = torch.empty(w.numel(), dtype=w.dtype, device=w.device)
        return buf[:w.numel()].view(w.shape)

    def init_state(self, params: list[Param]) -> None:
        """Create the state now (not at the first step), so a memory ledger sees it."""
        for prm in params:
            if prm.name not in self.state:
                st = _master(prm)
                like = st.get("master", prm.data)
                st.update(m=torch.zeros_like(like), v=torch.zeros_like(like))
                self.state[prm.name] = st

    def update(self, params: list[Param]) -> None:
        """This step's update of some params (call once per param per step)."""
        self.init_state(params)
        b1, b2 = self.betas
        with events.span("adamw", "optimizer", step=self.step_count):
            for prm in params:
                if prm.grad is None:
                    continue
                st = self.state[prm.name]
                w = st.get("master", prm.data)
                g = prm.grad if prm.grad.dtype == w.dtype else prm.grad.to(w.dtype)
                adamw_update_(w, g, st["m"], st["v"], self.lr, b1, b2, self.eps,
                              self.weight_decay, self.step_count, self._scratch_like(w))
                if "master" in st:
                    prm.data.copy_(w)

    def state_bytes(self) -> int:
        return _state_bytes(self.state)

    def bytes_per_element(self, dtype) -> int:
        return 12 if dtype in LOW_PRECISION else 8


def make_optimizer(name: str, lr: float | None = None, weight_decay: float | None = None):
    if name == "adamw":
        return AdamW(lr=1e-3 if lr is None else lr,
                     weight_decay=0.01 if weight_decay is None else weight_decay)
    if name == "sgd":
        return SGD(lr=0.1 if lr is None else lr, weight_decay=weight_decay or 0.0)
    raise ValueError(f"unknown optimizer {name!r}: pick adamw or sgd")
