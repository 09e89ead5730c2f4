"""Parameters and saved contexts shared by every hand-written layer.

A layer's `forward(x)` returns `(y, ctx)`; `backward_input(ctx, dy)` returns dX and keeps dY in ctx;
`backward_weight(ctx)` adds dW into each parameter's grad buffer. Keeping ctx outside the layer lets
one layer hold many microbatches in flight (pipeline schedules) and defer W (zero-bubble).
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

Ctx = SimpleNamespace


class Param:
    """A tensor and its grad buffer, plus where this piece sits in the global tensor.

    `shard` describes the local piece: None (whole tensor), or a tuple of slices per dim of the
    global tensor (tensor parallel). ZeRO keeps its own flat ranges beside it.
    `grad_hooks` are called after each accumulation with (param); `grad_count` counts them since
    the last zero_grad, so a bucketer knows when the last microbatch's grad has landed.
    """

    __slots__ = ("name", "data", "grad", "global_shape", "shard", "grad_hooks", "grad_count",
                 "replicated_over", "meta")

    def __init__(self, name: str, data: torch.Tensor, global_shape=None, shard=None):
        self.name = name
        self.data = data
        self.grad: torch.Tensor | None = None
        self.global_shape = tuple(global_shape if global_shape is not None else data.shape)
        self.shard = shard
        self.grad_hooks: list = []
        self.grad_count = 0
        self.replicated_over: list[str] = []  # groups whose ranks hold identical copies (grad sync)
        self.meta: dict = {}

    def accumulate(self, g: torch.Tensor) -> None:
        if self.grad is None:
            self.grad = g.to(self.data.dtype).clone() if g.dtype != self.data.dtype else g.clone()
        else:
            self.grad.add_(g)
        self._landed()

    def accumulate_matmul(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """grad += a @ b, fused (no temporary product) once the buffer exists."""
        if self.grad is None or a.dtype != self.grad.dtype:
            self.accumulate(a @ b)
            return
        self.grad.addmm_(a, b)
        self._landed()

    def _landed(self) -> None:
        self.grad_count += 1
        for hook in self.grad_hooks:
            hook(self)

    def zero_grad(self) -> None:
        if self.grad is not None:
            self.grad.zero_()
        self.grad_count = 0

    def __repr__(self) -> str:
        return f"Param({self.name}, local {tuple(self.data.shape)}, global {self.global_shape})"


class Layer:
    """Base: subclasses list their Params and sublayers; `params()` walks them with dotted names."""

    def own_params(self) -> dict[str, Param]:
        return {}

    def sublayers(self) -> dict[str, "Layer"]:
        return {}

    # selective recompute (kernels/recompute.py): a layer frees the saved tensors that are no
    # matmul's output and computes them again from what it keeps; by default it frees nothing
    def drop_recomputable(self, ctx) -> None:
        """Free the saved tensors this layer can rebuild cheaply (rebuild_recomputable)."""

    def rebuild_recomputable(self, ctx) -> None:
        """Compute again, bit for bit, what drop_recomputable freed."""

    def params(self, prefix: str = "") -> dict[str, Param]:
        out = {prefix + k: p for k, p in self.own_params().items()}
        for name, sub in self.sublayers().items():
            out.update(sub.params(prefix + name + "."))
        return out
