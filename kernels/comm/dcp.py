"""The door to torch.distributed.checkpoint (DCP): partui's hand-made shards described to it as
boxes of the full tensors, so DCP's own planner writes each element once and reshards on load.

A rank holds a tensor as one or more boxes of the unsharded tensor (`Boxes`): a TP slice is one
box, a ZeRO flat slice of a 2-D weight at most three (a partial row, whole rows, a partial row),
a DP or DualPipe replica the same box as its twin. On save every rank lists the boxes it owns;
DCP's coordinator keeps one writer per identical box (its dedup: replicas written once) and
refuses a plan whose boxes overlap or leave a hole. On load every rank lists the boxes it holds
(a ZeRO-1/2 rank holds whole params, owns a slice of them) and DCP reads each from whichever
saved boxes cover it, straight into the rank's own storage (the box tensors are live views).

Nothing here knows a plan: kernels/checkpoint/ says which boxes a rank has.
"""
from __future__ import annotations

import os
import warnings

import torch
from torch.distributed import checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   MetadataIndex, TensorProperties)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from kernels.comm.core import is_initialized

METADATA_FILE = ".metadata"     # DCP's own name for its index of every tensor's chunks


class Boxes:
    """A tensor of `global_shape` as this rank holds it: (offsets, local tensor) per box, each
    local tensor a live view of the rank's storage shaped as the box."""

    def __init__(self, global_shape, dtype: torch.dtype, boxes: list[tuple[tuple, torch.Tensor]]):
        self.global_shape = torch.Size(global_shape)
        self.dtype = dtype
        self.boxes = [(tuple(int(o) for o in off), t) for off, t in boxes if t.numel()]
        for off, t in self.boxes:
            if len(off) != len(self.global_shape) or any(
                    o < 0 or o + s > n for o, s, n in zip(off, t.shape, self.global_shape)):
                raise ValueError(f"box at {off} of shape {tuple(t.shape)} lies outside "
                                 f"{tuple(self.global_shape)}")

    def size(self) -> torch.Size:          # DCP compares it with the saved tensor's size
        return self.global_shape

    def __create_write_items__(self, fqn: str, obj) -> list[WriteItem]:
        props = TensorProperties(dtype=self.dtype)
        return [WriteItem(index=MetadataIndex(fqn, torch.Size(off)), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(
                              chunk=ChunkStorageMetadata(torch.Size(off), t.shape),
                              properties=props, size=self.global_shape))
                for off, t in self.boxes]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(torch.Size(off), t.shape) for off, t in self.boxes]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        for off, t in self.boxes:
            if torch.Size(off) == index.offset:
                return t
        raise ValueError(f"{index.fqn}: no box at {tuple(index.offset or ())} on this rank")


def _find(state: dict, index: MetadataIndex):
    obj = state[index.fqn]
    return obj.__get_tensor_shard__(index) if isinstance(obj, Boxes) else None


class BoxSavePlanner(DefaultSavePlanner):
    """DCP's default save planner (flattening, dedup of identical boxes, the coverage check),
    reading a box's data from the rank's Boxes."""

    def __init__(self, dedup: bool = True):
        super().__init__()
        self.dedup = dedup

    def _dedup_save_plans(self, all_plans):
        return super()._dedup_save_plans(all_plans) if self.dedup else all_plans

    def lookup_object(self, index: MetadataIndex):
        found = _find(self.state_dict, index)
        return found if found is not None else super().lookup_object(index)


class BoxLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner: each box this rank holds is read from the saved boxes that
    overlap it (its reshard), into the box's own storage. The state dict comes flat (fqn ->
    Boxes or tensor): the default set-up would replace every object it does not know by None."""

    def __init__(self):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def set_up_planner(self, state_dict, metadata=None, is_coordinator: bool = False) -> None:
        self.original_state_dict = self.state_dict = state_dict
        self.metadata, self.is_coordinator = metadata, is_coordinator

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        found = _find(self.state_dict, index)
        return found if found is not None else super().lookup_tensor(index)


def save(state: dict, path: str, dedup: bool = True) -> None:
    """Every rank of the world together (one rank alone when no world is up)."""
    dcp.save(state, storage_writer=FileSystemWriter(path, thread_count=1), planner=BoxSavePlanner(dedup),
             no_dist=not is_initialized())


def flat(state: dict, prefix: str = "") -> dict:
    """A nested state dict as DCP names its entries: "model.layers.0.attn.wq.weight"."""
    out = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def load(state: dict, path: str) -> None:
    """Fill `state`'s tensors and Boxes in place from the checkpoint at `path`."""
    dcp.load(flat(state), storage_reader=FileSystemReader(path), planner=BoxLoadPlanner(),
             no_dist=not is_initialized())


def read_metadata(path: str):
    """DCP's index of the checkpoint: fqn -> global size, dtype and saved chunks (one process)."""
    return FileSystemReader(path).read_metadata()


def tensor_index(path: str) -> dict[str, dict]:
    """fqn -> {shape, dtype, chunks: [(offsets, sizes)]} for every saved tensor (bytes: shape None)."""
    out = {}
    for fqn, md in read_metadata(path).state_dict_metadata.items():
        if isinstance(md, BytesStorageMetadata):
            out[fqn] = {"shape": None, "dtype": None, "chunks": []}
        else:
            out[fqn] = {"shape": list(md.size), "dtype": str(md.properties.dtype).replace("torch.", ""),
                        "chunks": [(list(c.offsets), list(c.sizes)) for c in md.chunks]}
    return out


def storage_of(path: str) -> dict[str, list]:
    """fqn -> [(offsets, file name, bytes)] per saved chunk: which file supplies which box."""
    md = read_metadata(path)
    out: dict[str, list] = {}
    for index, info in (md.storage_data or {}).items():
        out.setdefault(index.fqn, []).append(
            (list(index.offset or []), os.path.basename(str(info.relative_path)), int(info.length)))
    return out


def to_torch_save(path: str, out: str) -> None:
    """The checkpoint as one plain torch.save file of full tensors (DCP's own converter)."""
    dcp_to_torch_save(path, out)




def load_full(path: str) -> dict[str, torch.Tensor]:
    """Every saved tensor whole, by fqn, in one process (the single-process reference's resume;
    the whole model in one place by design there)."""
    out = {}
    for fqn, md in read_metadata(path).state_dict_metadata.items():
        if not isinstance(md, BytesStorageMetadata):
            out[fqn] = torch.zeros(md.size, dtype=md.properties.dtype)
    with warnings.catch_warnings():     # "no process group: one process" is the point here
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(out, storage_reader=FileSystemReader(path), planner=DefaultLoadPlanner(),
                 no_dist=True)
    return out


__all__ = ["Boxes", "save", "load", "load_full", "read_metadata", "tensor_index", "storage_of",
           "to_torch_save", "METADATA_FILE"]
