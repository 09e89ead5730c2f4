"""What a rank saves and loads, as boxes of the full tensors named as the single-process model
names them (kernels/comm/dcp.py writes and reads them).

    model.<name>                 the parameter (bf16 under --dtype bf16) and buffers: DeepSeek's
                                 layers.<i>.moe.selection_bias
    optim.<name>.exp_avg         AdamW's m           (torch.optim's names; fp32)
    optim.<name>.exp_avg_sq      AdamW's v
    optim.<name>.master          the fp32 master of a bf16 param (AdamW and SGD)
    train.step                   steps done: the data position (the next global batch is
                                 global_batch(seed, step), whatever the dp split)
    train.optimizer_step         the optimizer's step count (AdamW's bias correction)
    rng.rank<r>                  rank r's torch CPU RNG state

Save lists what the rank owns (a ZeRO rank its flat slice; a replica the same box as its twin,
which DCP writes once); load lists everything the rank holds (a ZeRO-1/2 rank holds every param
whole), so every element a rank computes with comes from the file.
"""
from __future__ import annotations

import torch

from kernels.checkpoint import faults
from kernels.comm.dcp import Boxes
from kernels.dp.buckets import flat_blocks, prod
from kernels.dp.sync import BucketedDP
from kernels.dp.zero import ZeroSync
from kernels.ep.deepseek_layer import selection_biases

STATE_NAMES = {"m": "exp_avg", "v": "exp_avg_sq", "master": "master"}   # ours -> the file's


def starts_of(prm) -> list[int]:
    """Where the Param's local tensor starts in its global tensor, per dim (TP / EP shards)."""
    if prm.shard is None:
        return [0] * len(prm.global_shape)
    return [s.start or 0 for s in prm.shard]


def whole(prm, t: torch.Tensor) -> tuple[tuple, torch.Tensor]:
    """The rank's whole local tensor of a Param (or a same-shaped state) as one box."""
    return tuple(starts_of(prm)), t.view(tuple(prm.data.shape) if prm.data.numel() else t.shape)


def flat_boxes(prm, local_shape, a: int, b: int, flat: torch.Tensor) -> list[tuple]:
    """Local flat elements [a, b) of a Param, held as `flat` (b - a elements), as boxes of the global
    tensor: row-major runs are contiguous, so each box is a view of `flat`. A 2-D weight gives at
    most three (part of a row, whole rows, part of a row)."""
    starts, out, pos = starts_of(prm), [], 0
    for box in flat_blocks(tuple(local_shape), a, b):
        sizes = [hi - lo for lo, hi in box]
        n = prod(sizes)
        out.append((tuple(s + lo for s, (lo, _) in zip(starts, box)), flat[pos:pos + n].view(sizes)))
        pos += n
    return out


class Collect:
    """name -> boxes, by kind, then as a DCP state dict."""

    def __init__(self):
        self.model: dict[str, list] = {}
        self.optim: dict[str, dict[str, list]] = {}
        self.shapes: dict[str, tuple] = {}
        self.dtypes: dict[tuple, torch.dtype] = {}

    def param(self, name, prm, boxes, dtype) -> None:
        self.shapes[name] = prm.global_shape
        self.model.setdefault(name, []).extend(boxes)
        self.dtypes[("model", name)] = dtype

    def state(self, name, prm, key: str, boxes, dtype) -> None:
        self.shapes[name] = prm.global_shape
        self.optim.setdefault(name, {}).setdefault(STATE_NAMES[key], []).extend(boxes)
        self.dtypes[("optim", name, key)] = dtype

    def state_dict(self) -> dict:
        model = {n: Boxes(self.shapes[n], self.dtypes[("model", n)], b) for n, b in self.model.items()}
        optim = {f"{n}.{k}": Boxes(self.shapes[n], b[0][1].dtype, b)
                 for n, kinds in self.optim.items() for k, b in kinds.items() if b}
        return {"model": model, "optim": optim}


def zero_boxes(sync: ZeroSync, col: Collect, holds: bool) -> None:
    """ZeRO: each unit's shard (params and state) cut back into its params' boxes; with `holds`
    (load) ZeRO-1/2 params whole, since the rank computes with all of them."""
    st = sync.optimizer.state
    for u in sync.units:
        state = st.get(u.shard.name, {})
        for i, a, b, c in sync.owned(u, u.rank):
            prm, name, n = u.params[i], u.names[i], b - a
            if not (holds and sync.stage < 3):
                col.param(name, prm, flat_boxes(prm, u.shapes[i], a, b, u.shard.data[c:c + n]),
                          u.dtype)
            for key, t in state.items():
                col.state(name, prm, key, flat_boxes(prm, u.shapes[i], a, b, t[c:c + n]), t.dtype)
        if holds and sync.stage < 3:
            for i, prm in enumerate(u.params):
                col.param(u.names[i], prm, [whole(prm, prm.data)], u.dtype)


def dense_boxes(sync, col: Collect) -> None:
    """Plain and bucketed DP: every param and its state whole (replicas: the same box)."""
    st = sync.optimizer.state
    if isinstance(sync, BucketedDP):
        for u in sync.units:
            state = st.get(u.flat.name, {})
            for i, prm in enumerate(u.params):
                col.param(u.names[i], prm, [whole(prm, prm.data)], prm.data.dtype)
                for key, t in state.items():
                    col.state(u.names[i], prm, key, [whole(prm, u.view(t, i))], t.dtype)
        return
    for name, prm in sync.params.items():
        col.param(name, prm, [whole(prm, prm.data)], prm.data.dtype)
        for key, t in (st.get(prm.name) or st.get(name) or {}).items():
            col.state(name, prm, key, [whole(prm, t)], t.dtype)


def rank_state(eng, holds: bool, rng_ranks=None, fault: str | None = None) -> dict:
    """This rank's state dict for DCP. holds=False: what it owns (save); True: what it holds
    (load). rng_ranks: the ranks whose RNG state the file has (load; None: this rank's).
    fault: a known bug to inject on save (kernels/checkpoint/faults.py; labs only)."""
    col = Collect()
    if isinstance(eng.sync, ZeroSync):
        zero_boxes(eng.sync, col, holds)
    else:
        dense_boxes(eng.sync, col)
    faults.on_save(col, eng.params, fault)
    sd = col.state_dict()
    for b in selection_biases(eng.layers):          # whole on every rank holding the layer
        sd["model"][b["name"]] = b["tensor"]
    sd["train"] = {"step": torch.tensor(eng.step_count, dtype=torch.int64),
                   "optimizer_step": torch.tensor(eng.optimizer.step_count, dtype=torch.int64)}
    rank = eng.ctx.rank
    if rng_ranks is None or rank in rng_ranks:
        sd["rng"] = {f"rank{rank}": torch.get_rng_state()}
    return sd


def apply_loaded(eng, sd: dict) -> None:
    """After DCP filled `sd` in place: the scalars and the RNG back into the engine; a bf16
    param equal to its master's rounding (ZeRO-1/2 owners wrote both; replicas read both)."""
    eng.step_count = int(sd["train"]["step"])
    eng.optimizer.step_count = int(sd["train"]["optimizer_step"])
    for state in sd.get("rng", {}).values():
        torch.set_rng_state(state)


__all__ = ["rank_state", "apply_loaded", "STATE_NAMES", "flat_boxes"]
