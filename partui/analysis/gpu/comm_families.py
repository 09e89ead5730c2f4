"""Which GPU kernels are communication: one table of name patterns per family, in one place, stdlib
only (the frame reader, the pandas-free report and `--help` all read it).

A kernel is comm when its name matches a family's pattern (searched, case-insensitive; the first
family that matches names it). `--comm-kernels REGEX` (the CLI) or `load(path, comm_kernels=[...])`
adds patterns as a family of their own, checked before the built-in ones.
"""
from __future__ import annotations

import re

FAMILIES = {  # family -> pattern (re.search, case-insensitive) over GPU kernel and memcpy names
    "NCCL": r"^nccl|ncclDevKernel|ncclKernel",
    "RCCL": r"^rccl|rccl_",
    "DeepEP": r"dpsk::ep::|deep_ep",
    "NVSHMEM": r"nvshmem",
    "p2p memcpy": r"^Memcpy PtoP|Memcpy .*Peer",
}
USER = "--comm-kernels"  # the family name of user-given patterns


class PatternError(ValueError):
    """A --comm-kernels pattern that is not a regular expression; the message names it and a fix."""


def family_patterns(extra=()) -> dict:
    """{family: compiled pattern}: the user's patterns first, then FAMILIES. A bad regex raises
    PatternError naming it."""
    table = {}
    for pattern in extra or ():
        try:
            table[f"{USER} {pattern}" if len(extra) > 1 else USER] = re.compile(pattern, re.I)
        except re.error as exc:
            raise PatternError(f"--comm-kernels {pattern!r}: not a valid regular expression ({exc}); "
                               f"escape special characters, e.g. 'my_a2a|dpsk::ep::'") from None
    table.update({name: re.compile(p, re.I) for name, p in FAMILIES.items()})
    return table


def family_names(names, extra=()) -> list:
    """The comm family of each distinct kernel name (None: not comm); a missing name (None) is none."""
    table = family_patterns(extra)
    return [None if n is None else next((fam for fam, rx in table.items() if rx.search(str(n))), None)
            for n in names]


def family_lines(rows, world: int, path: str) -> list[str]:
    """The report's lines from the family table's rows (rank, family, kernels, kernel_ms): which family
    matched how many kernels and how much time; a warning where a multi-rank job (world: its
    distributedInfo.world_size) shows no comm kernel at all (never a silent 0)."""
    lines = [f"comm kernels: rank {rank} {family} {kernels} kernels {kernel_ms:.3f} ms (summed, not merged)"
             for rank, family, kernels, kernel_ms in rows]
    if world > 1 and not lines:
        lines.append(f"warning: {path}: distributedInfo.world_size is {world} but no "
                     f"GPU kernel matched a comm family ({', '.join(FAMILIES)}), so comm reads 0; name your "
                     f"comm kernels with --comm-kernels REGEX")
    return lines
