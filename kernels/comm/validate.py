"""`--validate-comms` (on with `--check`): before each collective its op, Seq, sizes and dtypes
are all-gathered over a gloo group beside the op's own (`Group.check_pg`, so a comm thread posting
the op's group is never crossed) and compared; a rank that differs fails at once, naming both
ranks and both sides, instead of hanging or corrupting the sum.

What must agree: the op and its Seq everywhere; the sizes and dtypes of all_reduce, broadcast,
reduce_scatter and all_gather (and broadcast's root); only the dtypes of all_to_all, whose splits
differ by rank on purpose (expert parallel dispatch).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "barrier")
DTYPES = ("float32", "float64", "bfloat16", "float16", "int64", "int32", "int8", "uint8", "bool")
SIZED = ("all_reduce", "broadcast", "reduce_scatter", "all_gather")
WIDTH = 8   # op, seq, root, (numel, dtype) x 2 tensors, spare


class CommMismatch(RuntimeError):
    """Ranks were about to run one collective with different ops, sizes or dtypes."""


def _code(table, name: str) -> int:
    return table.index(name) if name in table else len(table)


def encode(rec) -> list[int]:
    row = [_code(OPS, rec.op), rec.seq, -1 if rec.peer is None else rec.peer]
    for shape, dtype in list(zip(rec.shapes, rec.dtypes))[:2]:
        n = 1
        for d in shape:
            n *= d
        row += [n, _code(DTYPES, dtype)]
    return row + [0] * (WIDTH - len(row))


def describe(row: list[int]) -> str:
    """What one rank gave: 'all_reduce seq 3 float32[4096]' (p2p-free: collectives only)."""
    op = OPS[row[0]] if row[0] < len(OPS) else "?"
    parts = []
    for i in (3, 5):
        if row[i + 1] or row[i]:
            dt = DTYPES[row[i + 1]] if row[i + 1] < len(DTYPES) else "?"
            parts.append(f"{dt}[{row[i]}]")
    root = f" root {row[2]}" if op == "broadcast" else ""
    return f"{op} seq {row[1]}{root} " + " -> ".join(parts) if parts else f"{op} seq {row[1]}"


def differs(a: list[int], b: list[int]) -> bool:
    if a[:2] != b[:2]:
        return True
    op = OPS[a[0]] if a[0] < len(OPS) else "?"
    if op in SIZED:
        return a[2:7] != b[2:7]
    if op == "all_to_all":
        return (a[4], a[6]) != (b[4], b[6])
    return False


def check(rec, group) -> None:
    """All-gather rec's metadata over group.check_pg and raise CommMismatch on any difference."""
    mine = torch.tensor(encode(rec), dtype=torch.int64)
    rows = [torch.empty_like(mine) for _ in group.ranks]
    dist.all_gather(rows, mine, group=group.check_pg)
    rows = [r.tolist() for r in rows]
    base = rows[group.rank]
    for i, row in enumerate(rows):
        if differs(base, row):
            me, other = group.ranks[group.rank], group.ranks[i]
            lo, hi = sorted((me, other))
            first, second = (base, row) if lo == me else (row, base)
            raise CommMismatch(
                f"--validate-comms: {rec.group} {rec.op} seq {rec.seq} differs between ranks {lo} "
                f"and {hi}: rank {lo} gave {describe(first)}, rank {hi} gave {describe(second)} "
                f"(one rank passed a different op, size or dtype; partui doctor on the flight "
                f"dump shows each rank's last ops)")
