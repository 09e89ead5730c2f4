"""The flight recorder's shared-memory row (torch-free): each rank mirrors its last MIRROR_ROWS ops
into memory the controller owns, as fixed-width int64 rows, so a rank that dies (gloo aborts the
process on a size mismatch) still leaves its last ops behind for `partui doctor`. kernels.comm.flight
writes the rows; partui.diagnosis.flight_gather reads them back with `decode`.
"""
from __future__ import annotations

import struct
from math import prod

OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "barrier",
       "send", "recv")
DTYPES = ("float32", "float64", "bfloat16", "float16", "int64", "int32", "int8", "uint8", "bool")
GROUP_NAMES = ("world", "tp", "cp", "dp", "pp", "ep", "ep_dp", "cp_dp", "pp_mirror", "tp_kv")
MIRROR_ROWS = 64
# one row: seq, comms_id, op, group, peer (-1 none), tag, step, numel and dtype of up to two
# tensors, t_issue, t_complete (0: not yet), the group's ranks as a bit mask, bytes, spare
COLUMNS = ("seq", "comms_id", "op", "group", "peer", "tag", "step", "numel0", "dtype0", "numel1",
           "dtype1", "t_issue", "t_complete", "ranks_mask", "bytes", "spare")
WIDTH = len(COLUMNS)
T_COMPLETE = COLUMNS.index("t_complete")
BLOCK = 1 + MIRROR_ROWS * WIDTH       # a rank's block: ops written so far, then the rows


def code(table: tuple, name: str) -> int:
    return table.index(name) if name in table else -1


def name_of(table: tuple, c: int) -> str:
    return table[c] if 0 <= c < len(table) else "?"


_CODES = {t: {n: i for i, n in enumerate(t)} for t in (OPS, DTYPES, GROUP_NAMES)}
_MASKS: dict = {}        # a group's ranks -> its bit mask (groups are few; each is computed once)


def _mask(ranks) -> int:
    key = tuple(ranks)
    m = _MASKS.get(key)
    if m is None:
        m = _MASKS[key] = sum(1 << r for r in key if r < 63)
    return m


def encode(seq, comms_id, op, group, peer, tag, step, shapes, dtypes, t_issue, t_complete, ranks,
           nbytes) -> list[int]:
    """One row (COLUMNS) as a list."""
    buf = bytearray(ROW.size)
    encode_into(buf, 0, seq, comms_id, op, group, peer, tag, step, shapes, dtypes, t_issue,
                t_complete, ranks, nbytes)
    return list(ROW.unpack(buf))


ROW = struct.Struct(f"={WIDTH}q")   # one row's bytes: packed in one call, not WIDTH item writes
_OP_CODES, _GROUP_CODES, _DTYPE_CODES = _CODES[OPS], _CODES[GROUP_NAMES], _CODES[DTYPES]


def encode_into(buf, offset: int, seq, comms_id, op, group, peer, tag, step, shapes, dtypes,
                t_issue, t_complete, ranks, nbytes) -> None:
    """One row (COLUMNS) packed into the bytes buf[offset:]; on every op's path, so table lookups,
    no loops but the tensors' and one pack (a shared array's slice assignment item by item cost
    3 us an op, the pack under 1 us)."""
    n0 = d0 = n1 = d1 = -1
    if shapes:
        n0, d0 = prod(shapes[0]), _DTYPE_CODES.get(dtypes[0], -1)
        if len(shapes) > 1:
            n1, d1 = prod(shapes[1]), _DTYPE_CODES.get(dtypes[1], -1)
    ROW.pack_into(buf, offset, seq, comms_id, _OP_CODES.get(op, -1), _GROUP_CODES.get(group, -1),
                  -1 if peer is None else peer, tag, step, n0, d0, n1, d1, t_issue,
                  t_complete or 0, _mask(ranks), nbytes, 0)


def decode(block) -> list[dict]:
    """A rank's block back into partui.diagnosis.doctor's records, oldest first."""
    written = int(block[0])
    rows = []
    for i in range(max(0, written - MIRROR_ROWS), written):
        r = [int(x) for x in block[1 + (i % MIRROR_ROWS) * WIDTH: 1 + (i % MIRROR_ROWS + 1) * WIDTH]]
        shapes, dtypes = [], []
        for n, d in ((r[7], r[8]), (r[9], r[10])):
            if n >= 0:
                shapes.append([n])
                dtypes.append(name_of(DTYPES, d))
        rows.append({"seq": r[0], "comms_id": r[1], "op": name_of(OPS, r[2]),
                     "group": name_of(GROUP_NAMES, r[3]), "peer": None if r[4] < 0 else r[4],
                     "tag": r[5], "step": r[6], "shapes": shapes, "dtypes": dtypes,
                     "t_issue": r[11], "t_complete": r[12] or None, "t_posted": None,
                     "ranks": [b for b in range(63) if r[13] >> b & 1], "bytes": r[14],
                     "span": None})
    return rows
