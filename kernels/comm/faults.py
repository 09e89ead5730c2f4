"""Faults on purpose (`--fault KIND@STEP:RANK`, parsed in planning/fault_spec.py): which op of the
step is the faulty one. The door (kernels.comm.core, kernels.comm.p2p) asks `take` at each op and
misbehaves as the kind says. One fault, once: it is spent at its op.

A swapped op is held (`Held`): not issued until the next op of its group of a different size has
been (two ops of one size swapped are silent: the same sizes, each other's data; only --check sees
that), or until someone waits on it (then there was nothing to swap with, and it runs in order).
"""
from __future__ import annotations

import time

import torch

from kernels.comm.flight import recorder as flight

LATE_S = 2.0        # how late `late` makes its rank: well under the doctor's hang threshold
SIZED_OPS = ("all_reduce", "broadcast")   # where `size` and `dtype` can bend the tensor
P2P = ("send", "recv")


class Armed:
    def __init__(self, kind: str, step: int, rank: int):
        self.kind, self.step, self.rank, self.spent = kind, step, rank, False


armed: Armed | None = None
held: list = []     # [Held] at most one: a swapped op waiting for its group's next op


def arm(kind: str | None, step: int = 0, rank: int = 0) -> None:
    """Arm one fault (kind None: disarm)."""
    global armed
    armed = Armed(kind, step, rank) if kind else None
    held.clear()


def take(op: str, group_name: str, group_size: int, me: int, async_op: bool = False) -> str | None:
    """The fault's kind if this op, on this rank at this step, is the one it strikes (spending it);
    else None. Ops of a group of one never are."""
    a = armed
    if a is None or a.spent or me != a.rank or flight.step != a.step or group_size < 2:
        return None
    if a.kind == "drop-recv":
        hit = op == "recv"
    elif op in P2P:
        hit = False
    elif a.kind in ("size", "dtype"):
        hit = op in SIZED_OPS
    elif a.kind == "swap":
        hit = op == "all_reduce" and async_op
    else:
        hit = True
    if hit:
        a.spent = True
        return a.kind
    return None


def late() -> None:
    time.sleep(LATE_S)


class Held:
    """A swapped op not yet issued: `issue()` posts it (once) and returns its real handle; it acts
    as the handle meanwhile, so a caller that waits on it first just runs it in order."""

    def __init__(self, group_name: str, issue, result, numel: int):
        self.group_name, self._issue, self.result, self._real = group_name, issue, result, None
        self.numel = numel

    def issue(self):
        if self._real is None:
            if self in held:
                held.remove(self)
            self._real = self._issue()
        return self._real

    @property
    def rec(self):
        """Its record, read through once it exists (a grad sync keeps it before it is issued)."""
        return LateRecord(self)

    def wait(self):
        return self.issue().wait()

    def is_completed(self) -> bool:
        return self._real is not None and self._real.is_completed()

    def __getattr__(self, name):          # rec and the rest: the real handle's, once issued
        return getattr(self.issue(), name)


class LateRecord:
    """A held op's OpRecord as seen before it is issued: reading any field issues it first."""

    def __init__(self, held_op: Held):
        self._held = held_op

    def __getattr__(self, name):
        return getattr(self._held.issue().rec, name)


def hold(group_name: str, issue, result) -> Held:
    h = Held(group_name, issue, result, result.numel())
    held.append(h)
    return h


def release_after(group_name: str, numel: int) -> None:
    """An op of group_name and numel elements was just posted: issue the op held to follow it,
    if their sizes differ (so the swap shows)."""
    for h in list(held):
        if h.group_name == group_name and h.numel != numel:
            h.issue()


def bent(kind: str | None, t: torch.Tensor) -> torch.Tensor:
    """The tensor a size or dtype fault passes instead of t (t itself is left untouched)."""
    if kind == "size":
        return t.new_zeros(max(1, t.numel() // 2) if t.numel() > 2 else t.numel() + 1)
    if kind == "dtype":
        return t.to(torch.float32 if t.dtype == torch.float64 else torch.float64)
    return t
