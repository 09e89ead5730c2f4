"""`partui plan --resume DIR`: the reshard on paper. For each tensor of a checkpoint, which of the
saved plan's ranks supply which pieces to which of the new plan's ranks, and the bytes each new
rank reads. Nothing launches: each new rank's engine is built as that rank (kernels.comm.dry_rank)
and lists the boxes it would load (kernels/checkpoint/state.py, the very list the load hands DCP);
each saved box's writer is the rank in its file's name (DCP's `__<rank>_0.distcp`)."""
from __future__ import annotations

import math
import re

from kernels import comm
from kernels.checkpoint.state import rank_state
from kernels.comm import dcp
from kernels.comm.dcp import Boxes
from kernels.engine import Engine

WRITER = re.compile(r"__(\d+)_")
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "uint8": 1}


def overlap(a_off, a_size, b_off, b_size):
    """The box both boxes cover, (offsets, sizes), or None."""
    lo = [max(x, y) for x, y in zip(a_off, b_off)]
    hi = [min(x + s, y + t) for x, s, y, t in zip(a_off, a_size, b_off, b_size)]
    return None if any(h <= low for low, h in zip(lo, hi)) else (lo, [h - low for low, h in zip(lo, hi)])


def held_boxes(plan, cfg, rank: int) -> dict[str, list]:
    """fqn -> [(offsets, sizes)] of every box `rank` of `plan` loads."""
    with comm.dry_rank(rank, plan.world):
        eng = Engine(plan, cfg, rank=rank)
        sd = dcp.flat(rank_state(eng, holds=True, rng_ranks=set()))
    out = {}
    for fqn, obj in sd.items():
        if isinstance(obj, Boxes):
            out[fqn] = [(list(off), list(t.shape)) for off, t in obj.boxes]
        elif fqn.startswith("model."):       # buffers: whole
            out[fqn] = [([0] * obj.dim(), list(obj.shape))]
    return out


def reshard_map(ckpt: str, plan, cfg) -> dict:
    """{"rows": [{tensor, from_rank, to_rank, offsets, sizes, bytes}], "read_bytes": {new rank:
    bytes}, "saved_world"}: every saved chunk a new rank's box overlaps, and how much of it."""
    index, files = dcp.tensor_index(ckpt), dcp.storage_of(ckpt)
    rows, read = [], {r: 0 for r in range(plan.world)}
    for rank in range(plan.world):
        for fqn, boxes in held_boxes(plan, cfg, rank).items():
            per = ELEMENT_BYTES.get(index[fqn]["dtype"], 4)
            for off, size in boxes:
                for (s_off, s_size), (_, fname, _) in zip(index[fqn]["chunks"],
                                                          sorted_storage(files[fqn], index[fqn])):
                    both = overlap(off, size, s_off, s_size)
                    if both is None:
                        continue
                    n = math.prod(both[1]) * per
                    rows.append({"tensor": fqn, "from_rank": int(WRITER.match(fname).group(1)),
                                 "to_rank": rank, "offsets": both[0], "sizes": both[1], "bytes": n})
                    read[rank] += n
    return {"rows": rows, "read_bytes": read}


def sorted_storage(storage: list, entry: dict) -> list:
    """The storage records in the order of the index's chunks (matched by offsets)."""
    by_off = {tuple(rec[0]): rec for rec in storage}
    return [by_off[tuple(off)] for off, _ in entry["chunks"]]


def box_text(off, sizes) -> str:
    return "[" + ", ".join(f"{o}:{o + s}" for o, s in zip(off, sizes)) + "]"


def reshard_text(doc: dict, saved_plan: str, new_plan: str, every: bool = False) -> str:
    """The map as text: one line per (tensor, saved rank -> new rank) piece (the model's tensors;
    `every`: the optimizer's too), then the bytes each new rank reads."""
    lines = [f"reshard: saved under {saved_plan} -> {new_plan}",
             f"{'tensor':<42} {'saved':>5} -> {'new':>3}  {'piece (rows:cols of the full tensor)':<38} {'bytes':>9}"]
    for r in doc["rows"]:
        if every or r["tensor"].startswith("model."):
            lines.append(f"{r['tensor']:<42} {r['from_rank']:>5} -> {r['to_rank']:>3}  "
                         f"{box_text(r['offsets'], r['sizes']):<38} {r['bytes']:>9,}")
    lines.append("bytes each new rank reads (params, optimizer state, buffers, step): " + ", ".join(
        f"rank {r} {n:,}" for r, n in doc["read_bytes"].items()))
    return "\n".join(lines)
