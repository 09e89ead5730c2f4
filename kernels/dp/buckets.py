"""Flat buffers of parameters for gradient sync: buckets (DP, ZeRO-1/2) and layer units (ZeRO-3).

A `FlatUnit` packs some Params of one sync group back to back in one flat buffer, padded to a
multiple of `pad_to` (the group size for ZeRO, so every rank owns an equal contiguous chunk).
Units are built in reverse forward order, which is the order backward produces gradients.

`ReadyOrder` issues each unit's collective the moment its last gradient lands (counted with
`Param.grad_count` against the accumulations per step the runner gives for each param:
`runner.accumulations()`), but always in unit order, so every rank of a group issues the same
collectives in the same order (gloo matches them by order).
"""
from __future__ import annotations

import math

import torch

from kernels import comm


def sync_group_name(ctx, prm) -> str:
    if "dp_group" in prm.meta:
        return prm.meta["dp_group"]
    return "cp_dp" if ctx.plan.cp > 1 else "dp"


class FlatUnit:
    """Params laid out flat: param i is elements [offsets[i], offsets[i] + numels[i])."""

    def __init__(self, index: int, group: comm.Group, items: list[tuple[str, object]],
                 pad_to: int = 1):
        self.index, self.group = index, group
        self.names = [n for n, _ in items]
        self.params = [p for _, p in items]
        self.shapes = [tuple(p.data.shape) for p in self.params]
        self.numels = [p.data.numel() for p in self.params]
        self.offsets, off = [], 0
        for n in self.numels:
            self.offsets.append(off)
            off += n
        self.numel = off
        self.padded = -(-off // pad_to) * pad_to        # whole buffer, divisible by pad_to
        self.chunk = self.padded // pad_to               # one rank's share when pad_to = size
        self.dtype = self.params[0].data.dtype
        self.ready = 0
        self.grad = None                                 # flat grad buffer [padded] (or None)

    def view(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        return flat[self.offsets[i]:self.offsets[i] + self.numels[i]].view(self.shapes[i])

    def adopt_grad(self, i: int) -> None:
        """Make param i's grad a view of the flat grad buffer (allocated here if needed)."""
        prm = self.params[i]
        if self.grad is None:
            self.grad = torch.zeros(self.padded, dtype=self.dtype)
        view = self.view(self.grad, i)
        if prm.grad is None:
            prm.grad = view
        elif prm.grad.data_ptr() != view.data_ptr():  # first accumulate cloned a fresh grad
            view.copy_(prm.grad)
            prm.grad = view

    def bind_grads(self) -> None:
        for i in range(len(self.params)):
            self.adopt_grad(i)

    def zero_grads(self) -> None:
        """A new step: one memset of the flat grad, each param's grad (re)pointed at its view
        and its accumulation count reset (Param.zero_grad would zero each view again)."""
        if self.grad is None:
            self.grad = torch.zeros(self.padded, dtype=self.dtype)
        else:
            self.grad.zero_()
        for i, prm in enumerate(self.params):
            if prm.grad is None or prm.grad.data_ptr() != self.grad.data_ptr() + \
                    self.offsets[i] * self.grad.element_size():
                prm.grad = self.view(self.grad, i)
            prm.grad_count = 0


def build_units(ctx, params: dict, unit_bytes: float | None, pad_to_group: bool,
                split_key=None) -> list[FlatUnit]:
    """Units per (sync group, dtype), in reverse forward order. A unit closes when it reaches
    `unit_bytes`, or, with `split_key`, when the key of the next param (e.g. its layer) changes."""
    by_group: dict[tuple, list] = {}
    for name, prm in reversed(list(params.items())):
        by_group.setdefault((sync_group_name(ctx, prm), prm.data.dtype), []).append((name, prm))
    units = []
    for (gname, _), items in by_group.items():
        group = ctx.group(gname)
        pad = group.size if pad_to_group else 1
        cur, cur_bytes, cur_key = [], 0, None
        for name, prm in items:
            key = split_key(name) if split_key else None
            if cur and ((split_key and key != cur_key) or
                        (unit_bytes is not None and cur_bytes >= unit_bytes)):
                units.append(FlatUnit(len(units), group, cur, pad))
                cur, cur_bytes = [], 0
            cur.append((name, prm))
            cur_bytes += prm.data.numel() * prm.data.element_size()
            cur_key = key
        if cur:
            units.append(FlatUnit(len(units), group, cur, pad))
    return units


class ReadyOrder:
    """Counts each param's accumulations; issues a unit once all its params are final, in order.

    `accumulations`: param name -> how many times the runner accumulates its grad in one step
    (runner.accumulations()); a param is final at its last."""

    def __init__(self, units: list[FlatUnit], accumulations: dict[str, int], issue,
                 reduce_partial):
        self.units, self.issue, self.reduce_partial = units, issue, reduce_partial
        names = [n for u in units for n in u.names]
        missing = [n for n in names if n not in accumulations]
        if missing:
            raise ValueError(f"the runner gives no accumulation count for {missing}: its "
                             f"accumulations() must name every param its params() returns")
        bad = {n: accumulations[n] for n in names if accumulations[n] < 1}
        if bad:
            raise ValueError(f"accumulations per step {bad} must be >= 1: a param the runner "
                             f"never accumulates has no business in the grad sync")
        self.expected = {id(p): accumulations[n] for u in units for n, p in zip(u.names, u.params)}
        self.slot = {id(p): (u, i) for u in units for i, p in enumerate(u.params)}
        self.order: dict[str, list[FlatUnit]] = {}
        for u in units:
            self.order.setdefault(u.group.name, []).append(u)
        self.reset()

    def reset(self) -> None:
        self.next = {g: 0 for g in self.order}
        self.issued: set[int] = set()
        for u in self.units:
            u.ready = 0

    def on_grad(self, prm) -> None:
        unit, i = self.slot[id(prm)]
        unit.adopt_grad(i)
        want = self.expected[id(prm)]
        if prm.grad_count > want or id(unit) in self.issued:
            raise RuntimeError(
                f"{unit.names[i]} got gradient accumulation {prm.grad_count} but the runner's "
                f"accumulations() said {want} per step and its bucket is already synced: make "
                f"the runner count every accumulation of its params in a step")
        if prm.grad_count == want:
            self.reduce_partial(prm)
            unit.ready += 1
            if unit.ready == len(unit.params):
                self._drain(unit.group.name, upto=None)

    def _drain(self, gname: str, upto) -> None:
        units = self.order[gname]
        while self.next[gname] < len(units):
            u = units[self.next[gname]]
            if upto is None and u.ready < len(u.params):
                return
            self.issued.add(id(u))
            self.issue(u)
            self.next[gname] += 1

    def flush(self) -> None:
        """After backward: issue what is left (params that got fewer grads), still in order."""
        for gname, units in self.order.items():
            for u in units[self.next[gname]:]:
                for i, p in enumerate(u.params):
                    if p.grad_count < self.expected[id(p)]:
                        if p.grad is not None:
                            u.adopt_grad(i)
                        self.reduce_partial(p)
                if u.grad is None:
                    u.grad = torch.zeros(u.padded, dtype=u.dtype)
            self._drain(gname, upto="all")


def overlap_share(records, t_start: int, t_backward_end: int) -> float | None:
    """Share of grad-sync in-flight time (merged) that fell before backward ended."""
    iv = sorted((r.t_issue, r.t_complete or t_backward_end) for r in records if r.nbytes)
    merged = []
    for a, b in iv:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    total = sum(b - a for a, b in merged)
    if not total:
        return None
    inside = sum(max(0, min(b, t_backward_end) - max(a, t_start)) for a, b in merged)
    return inside / total


def prod(shape) -> int:
    return math.prod(shape) if shape else 1


def flat_blocks(shape, a: int, b: int) -> list[list[list[int]]]:
    """Elements [a, b) of a row-major tensor as boxes [[start, stop] per dim]."""
    if a >= b:
        return []
    if len(shape) == 1:
        return [[[a, b]]]
    inner = prod(shape[1:])
    r0, r1 = a // inner, (b - 1) // inner
    if r0 == r1:
        return [[[r0, r0 + 1]] + blk for blk in flat_blocks(shape[1:], a - r0 * inner,
                                                             b - r0 * inner)]
    out = []
    if a % inner:
        out += flat_blocks(shape, a, (r0 + 1) * inner)
        r0 += 1
    full_end = b // inner
    if full_end > r0:
        out.append([[r0, full_end]] + [[0, n] for n in shape[1:]])
    if b % inner:
        out += flat_blocks(shape, full_end * inner, b)
    return out


def global_pieces(prm, shape, a: int, b: int) -> list[tuple[str, list]]:
    """Local flat elements [a, b) of a Param as pieces of its global tensor: ("flat", [s, e])
    when the local tensor is the whole tensor, else ("slice", box) per box (tensor parallel)."""
    if prm.shard is None:
        return [("flat", [a, b])] if b > a else []
    starts = [s.start or 0 for s in prm.shard]
    return [("slice", [[s + lo, s + hi] for s, (lo, hi) in zip(starts, box)])
            for box in flat_blocks(shape, a, b)]
