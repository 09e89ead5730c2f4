"""ZeRO-3's parameters, one layer at a time: all-gathered before use, freed after.

Only each rank's shard of a layer unit persists (kernels/dp/zero.py). Before a layer's forward,
and again before its backward, `gather_layer` all-gathers the full flat params of the layer's
units and points each Param's data at its view; `release_layer` lets them go. The first step
records the order layers are gathered in; from then on gathering one layer also starts the next
one's all-gather (async: a prefetch), and `start_step` starts the first layer's.
"""
from __future__ import annotations

import torch

from kernels import comm


class LayerGather:
    """The full params of ZeRO-3 units: free -> inflight (all-gather issued) -> ready (in place)."""

    def __init__(self, units: list, layer_units, memory=None):
        self.memory = memory                    # kernels.memory.MemoryAccount: its "gathered" kind
        self.layer_units = layer_units          # layer -> the FlatUnits holding its params
        for u in units:
            u.full_param, u.state, u.pending = None, "free", None
        self.gathered_bytes = self.gathered_peak = 0
        self.recorded: list = []                # layers in gather order, seen on the first step
        self.recording, self.event_i = True, 0

    def start_step(self) -> None:
        self.event_i = 0
        if not self.recording and self.recorded:
            self._gather(self.layer_units(self.recorded[0]), wait=False)

    def finish_step(self) -> None:
        """The gather order of a step is known now: later steps prefetch by it."""
        self.recording = False

    def gather_layer(self, layer) -> None:
        units = self.layer_units(layer)
        self._gather(units, wait=False)
        if self.recording:
            self.recorded.append(layer)
        else:
            i = self.event_i
            self.event_i += 1
            if i + 1 < len(self.recorded) and self.recorded[i] is layer:
                self._gather(self.layer_units(self.recorded[i + 1]), wait=False)  # prefetch
        self._gather(units, wait=True)

    def release_layer(self, layer) -> None:
        for u in self.layer_units(layer):
            if u.state == "ready":
                for p in u.params:
                    p.data = torch.empty(0, dtype=u.dtype)
                self.gathered_bytes -= u.padded * u.full_param.element_size()
                u.full_param, u.state = None, "free"
                self.memory and self.memory.set("gathered", self.gathered_bytes)

    def _gather(self, units, wait: bool) -> None:
        for u in units:
            if u.state == "free":
                u.full_param = torch.empty(u.padded, dtype=u.dtype)   # [padded]
                u.pending = comm.all_gather(u.full_param, u.shard.data, u.group, async_op=True)
                u.state = "inflight"
                self.gathered_bytes += u.padded * u.full_param.element_size()
                self.gathered_peak = max(self.gathered_peak, self.gathered_bytes)
                self.memory and self.memory.set("gathered", self.gathered_bytes)
        if wait:
            for u in units:
                if u.state == "inflight":
                    u.pending.wait()
                    u.pending, u.state = None, "ready"
                    for i, p in enumerate(u.params):
                        p.data = u.view(u.full_param, i)
