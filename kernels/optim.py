"""Hand-written optimizers over Params (dense tensors or ZeRO's flat shards); state in place.

AdamW follows torch.optim.AdamW's arithmetic order exactly (decoupled decay first, then the
bias-corrected update), so the two agree to rounding.
"""
from __future__ import annotations

import math

import torch

from kernels import events
from kernels.layers import Param


class SGD:
    def __init__(self, lr: float = 0.1, weight_decay: float = 0.0):
        self.lr, self.weight_decay = lr, weight_decay
        self.state: dict[str, dict] = {}
        self.step_count = 0

    def step(self, params: list[Param]) -> None:
        self.step_count += 1
        with events.span("sgd", "optimizer", step=self.step_count):
            for prm in params:
                if prm.grad is None:
                    continue
                if self.weight_decay:
                    prm.data.mul_(1 - self.lr * self.weight_decay)
                prm.data.add_(prm.grad.to(prm.data.dtype), alpha=-self.lr)

    def state_bytes(self) -> int:
        return 0


class AdamW:
    """m, v per parameter (fp32 or the param's dtype), one shared step count."""

    def __init__(self, lr: float = 1e-3, betas=(0.9, 0.95), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.state: dict[str, dict] = {}
        self.step_count = 0

    def step(self, params: list[Param]) -> None:
        self.step_count += 1
        b1, b2 = self.betas
        t = self.step_count
        bias1, bias2 = 1 - b1 ** t, 1 - b2 ** t
        step_size = self.lr / bias1
        with events.span("adamw", "optimizer", step=t):
            for prm in params:
                if prm.grad is None:
                    continue
                st = self.state.get(prm.name)
                if st is None:
                    st = self.state[prm.name] = {"m": torch.zeros_like(prm.data),
                                                 "v": torch.zeros_like(prm.data)}
                g = prm.grad if prm.grad.dtype == prm.data.dtype else prm.grad.to(prm.data.dtype)
                prm.data.mul_(1 - self.lr * self.weight_decay)
                st["m"].lerp_(g, 1 - b1)
                st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (st["v"].sqrt() / math.sqrt(bias2)).add_(self.eps)
                prm.data.addcdiv_(st["m"], denom, value=-step_size)

    def state_bytes(self) -> int:
        return sum(s["m"].numel() * s["m"].element_size() * 2 for s in self.state.values())


def make_optimizer(name: str, lr: float | None = None, weight_decay: float | None = None):
    if name == "adamw":
        return AdamW(lr=1e-3 if lr is None else lr,
                     weight_decay=0.01 if weight_decay is None else weight_decay)
    if name == "sgd":
        return SGD(lr=0.1 if lr is None else lr, weight_decay=weight_decay or 0.0)
    raise ValueError(f"unknown optimizer {name!r}: pick adamw or sgd")
