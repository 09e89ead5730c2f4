"""Megatron's f and g for tensor parallel, and their sequence-parallel forms, as Block regions.

    f = CopyToTP          identity forward, all-reduce of dX backward   (before column linears)
    g = ReduceFromTP      all-reduce forward, identity backward         (after row linears)
    GatherSeqToTP         sp's f: all-gather along seq forward, reduce-scatter of dX backward
    ScatterSeqFromTP      sp's g: reduce-scatter along seq forward, all-gather of dY backward

A region has forward(x) -> (y, ctx) and backward(ctx, dy) -> dx; the f forms also have
start_backward(ctx, dy) -> Pending, so a block can run weight grads while dX is in flight.
"""
from __future__ import annotations

import torch

from kernels import comm


class Pending:
    """A region's backward collective in flight; `wait()` finishes it and returns dX."""

    def __init__(self, handle, finish):
        self.handle, self.finish = handle, finish

    def wait(self):
        if self.handle is not None:
            self.handle.wait()
        return self.finish()


def start_region_backward(region, ctx, dy) -> Pending:
    """Issue a region's backward async when it can (tp regions), else run it now (Identity)."""
    if hasattr(region, "start_backward"):
        return region.start_backward(ctx, dy)
    dx = region.backward(ctx, dy)
    return Pending(None, lambda: dx)


class _AutogradRegion(torch.autograd.Function):
    """Lets `backward=autograd` see through a region: its backward is the region's own."""

    @staticmethod
    def forward(fctx, x, region):
        fctx.region = region
        return region.communicate(x.clone())   # a copy: regions may reduce in place

    @staticmethod
    def backward(fctx, dy):
        return fctx.region.backward(None, dy.clone()), None


class Region:
    """forward(x) -> (y, None) runs `communicate`; under autograd it is one differentiable op."""

    def __init__(self, group: comm.Group):
        self.group = group

    def forward(self, x):
        if torch.is_grad_enabled() and x.requires_grad:
            return _AutogradRegion.apply(x, self), None
        return self.communicate(x), None


class CopyToTP(Region):
    """f: identity forward; backward all-reduces dX, the partial input grads of column linears."""

    def communicate(self, x):
        return x

    def start_backward(self, ctx, dy):
        dy = dy.contiguous()   # reduced in place: dy is the column linears' fresh dX sum
        return Pending(comm.all_reduce(dy, self.group, async_op=True), lambda: dy)

    def backward(self, ctx, dy):
        return self.start_backward(ctx, dy).wait()


class ReduceFromTP(Region):
    """g: all-reduce forward (sums the row linears' partial outputs); identity backward."""

    def communicate(self, x):
        x = x.contiguous()
        comm.all_reduce(x, self.group)   # in place: x is the row linear's fresh output
        return x

    def backward(self, ctx, dy):
        return dy


def gather_seq(x, group: comm.Group, async_op: bool = False):
    """[B, S/tp, D] on each rank -> [B, S, D], rank i's slice at rows i*S/tp of the sequence."""
    b, s, d = x.shape
    n = group.size
    out = torch.empty(n * b * s * d, dtype=x.dtype)                  # [tp * B * S/tp * D]
    h = comm.all_gather(out, x.contiguous().reshape(-1), group, async_op=True)
    pend = Pending(h, lambda: out.reshape(n, b, s, d).transpose(0, 1).reshape(b, n * s, d))
    return pend if async_op else pend.wait()


def scatter_seq(x, group: comm.Group, async_op: bool = False):
    """[B, S, D] partial sums on each rank -> their sum's sequence slice [B, S/tp, D]."""
    b, full, d = x.shape
    n = group.size
    s = full // n
    inp = x.reshape(b, n, s, d).transpose(0, 1).contiguous().reshape(-1)  # rank i's chunk first
    out = torch.empty(b, s, d, dtype=x.dtype)                              # [B, S/tp, D]
    h = comm.reduce_scatter(out.view(-1), inp, group, async_op=True)
    pend = Pending(h, lambda: out)
    return pend if async_op else pend.wait()


class GatherSeqToTP(Region):
    """sp's f: all-gather the sequence before the column linears; reduce-scatter dX backward."""

    def communicate(self, x):               # [B, S/tp, D] -> [B, S, D]
        return gather_seq(x, self.group)

    def start_backward(self, ctx, dy):      # [B, S, D] partial -> [B, S/tp, D] summed
        return scatter_seq(dy, self.group, async_op=True)

    def backward(self, ctx, dy):
        return self.start_backward(ctx, dy).wait()


class ScatterSeqFromTP(Region):
    """sp's g: reduce-scatter the row linears' partial outputs along seq; all-gather dY backward."""

    def communicate(self, x):               # [B, S, D] partial -> [B, S/tp, D]
        return scatter_seq(x, self.group)

    def backward(self, ctx, dy):            # [B, S/tp, D] -> [B, S, D]
        return gather_seq(dy, self.group)
