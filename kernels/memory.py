"""A rank's memory account: the bytes of tensors it holds, by kind, updated at every action.

Kinds (KINDS, each with its meaning in planning/memory_kinds.py): params, grads, optimizer,
workspace, activations, gathered and comm.

The hand-written layers return their saved tensors in a context (kernels/layers/base.Ctx), so
`saved_bytes` of that context is exactly what they keep: no sampling, no allocator. The account
itself is integer adds; only while `recording` (a trace) does each change also go to the recorder
hook as a counter of every kind (kernels/comm/events.counter).
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch

from kernels.comm import events
from planning.memory_kinds import KINDS


def saved_bytes(obj, seen: set | None = None) -> int:
    """Bytes of the distinct storages of every tensor inside `obj` (contexts, dataclasses, lists, dicts):
    a view keeps its whole storage alive, and a tensor saved twice counts once."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        root = obj if obj._base is None else obj._base    # a view's base owns its storage
        ptr = root.data_ptr()                             # (cheaper than untyped_storage())
        if ptr in seen or root.nbytes == 0:
            return 0
        seen.add(ptr)
        return root.nbytes
    if isinstance(obj, SimpleNamespace) or (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        obj = vars(obj).values()          # a context, or a record of tensors (MoE routing, rows)
    elif isinstance(obj, dict):
        obj = obj.values()
    elif not isinstance(obj, (list, tuple)):
        return 0
    return sum(saved_bytes(v, seen) for v in obj)


class MemoryAccount:
    """One rank's bytes by kind, their step peak, the action at it and the in-flight microbatch
    count (activation entries held at once). A StepStats collector: `take()` gives the step's."""

    def __init__(self):
        self.bytes = dict.fromkeys(KINDS, 0)
        self.held: dict = {}              # (kind, key) -> bytes of a held entry
        self.stacks: dict = {}            # key -> saved bytes of each layer (kernels.model)
        self.entries = dict.fromkeys(KINDS, 0)
        self.action = "step start"
        self.recording = False            # counters only while a trace records
        self.reset_peak()

    # ---- updates
    def set(self, kind: str, nbytes: int) -> None:
        self.bytes[kind] = int(nbytes)
        self._changed(kind)

    def hold(self, kind: str, key, nbytes: int) -> None:
        """An entry of `kind` (a microbatch's contexts, a buffer) is now held."""
        old = self.held.pop((kind, key), None)
        if old is None:
            self.entries[kind] += 1
        self.held[(kind, key)] = nbytes
        self.bytes[kind] += nbytes - (old or 0)
        self._changed(kind)

    def drop(self, kind: str, key) -> None:
        nbytes = self.held.pop((kind, key), None)
        if nbytes is not None:
            self.entries[kind] -= 1
            self.bytes[kind] -= nbytes
            self._changed(kind)

    def stack(self, key, ctx) -> None:
        """Without a pipeline: a microbatch's entry grows by each layer's saved context."""
        sizes = self.stacks.setdefault(key, [])
        sizes.append(saved_bytes(ctx))
        self.hold("activations", key, sum(sizes))

    def unstack(self, key) -> None:
        """Its last layer's backward is done: the entry shrinks, and goes with the first layer."""
        sizes = self.stacks[key]
        sizes.pop()
        self.hold("activations", key, sum(sizes)) if sizes else self.drop("activations", key)

    def at(self, action) -> None:
        """The action now running (named by its str() only when a peak or sample shows it)."""
        self.action = action
        self._changed()

    # ---- figures
    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def _changed(self, kind: str | None = None) -> None:
        if kind is not None and self.bytes[kind] > self.kind_peaks[kind]:
            self.kind_peaks[kind] = self.bytes[kind]
        total = self.total
        if total > self.peak:
            self.peak, self.peak_at, self.peak_kinds = total, self.action, dict(self.bytes)
        self.peak_entries = max(self.peak_entries, self.entries["activations"])
        if self.recording:
            events.counter("memory", **self.bytes)

    def reset_peak(self) -> None:
        self.peak, self.peak_at, self.peak_kinds = -1, self.action, dict(self.bytes)
        self.peak_entries = self.entries["activations"]
        self.kind_peaks = dict(self.bytes)      # each kind's own step peak

    def take(self) -> dict:
        """This step's peak (total, the action at it, each kind then), each kind's own peak, the
        most activation entries (microbatch x chunk contexts) held at once, and the bytes now;
        the peaks start over."""
        out = {"memory": {"peak": max(self.peak, 0), "peak_at": str(self.peak_at),
                          "peak_kinds": self.peak_kinds, "kind_peaks": self.kind_peaks,
                          "peak_activation_entries":
                          self.peak_entries, "now": dict(self.bytes)}}
        self.reset_peak()
        self._changed()
        return out


def account_of(stats) -> MemoryAccount:
    """The rank's account, kept in its StepStats (kernels/stats.py) like every collector."""
    return stats.collector("memory", MemoryAccount)


class HeldDict(dict):
    """A dict whose entries the account holds while they sit in it (the pipeline's saved
    contexts, W queue, posted recvs): set adds their bytes, pop drops them."""

    def __init__(self, account: MemoryAccount, kind: str, tag: str, size=saved_bytes):
        super().__init__()
        self.account, self.kind, self.tag, self.size = account, kind, tag, size

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.account.hold(self.kind, (self.tag, key), self.size(value))

    def pop(self, key, *default):
        value = super().pop(key, *default)
        self.account.drop(self.kind, (self.tag, key))
        return value
