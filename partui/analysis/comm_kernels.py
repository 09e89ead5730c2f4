"""Which GPU kernels are communication: one table of name patterns per family, in one place.

A kernel is comm when its name matches a family's pattern (searched, case-insensitive; the first
family that matches names it). `--comm-kernels REGEX` (the CLI) or `load(path, comm_kernels=[...])`
adds patterns as a family of their own, checked before the built-in ones.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from partui.analysis.events import TraceError
from partui.analysis.gpu_steps import counted_rows

FAMILIES = {  # family -> pattern (re.search, case-insensitive) over GPU kernel and memcpy names
    "NCCL": r"^nccl|ncclDevKernel|ncclKernel",
    "RCCL": r"^rccl|rccl_",
    "DeepEP": r"dpsk::ep::|deep_ep",
    "NVSHMEM": r"nvshmem",
    "p2p memcpy": r"^Memcpy PtoP|Memcpy .*Peer",
}
USER = "--comm-kernels"  # the family name of user-given patterns


def families(extra=()) -> dict:
    """{family: compiled pattern}: the user's patterns first, then FAMILIES. A bad regex raises
    TraceError naming it."""
    table = {}
    for pattern in extra or ():
        try:
            table[f"{USER} {pattern}" if len(extra) > 1 else USER] = re.compile(pattern, re.I)
        except re.error as exc:
            raise TraceError(f"--comm-kernels {pattern!r}: not a valid regular expression ({exc}); "
                             f"escape special characters, e.g. 'my_a2a|dpsk::ep::'") from None
    table.update({name: re.compile(p, re.I) for name, p in FAMILIES.items()})
    return table


def family_of(names: pd.Series, gpu: np.ndarray, extra=()) -> np.ndarray:
    """Each row's comm family (object array; None where not a comm kernel), for GPU rows only:
    each distinct name is matched once (a trace has a few thousand names among millions of rows)."""
    table = families(extra)
    cats = names.astype("category")
    labels = [next((fam for fam, rx in table.items() if rx.search(str(n))), None)
              for n in cats.cat.categories]
    codes = cats.cat.codes.to_numpy()
    out = np.array(labels + [None], dtype=object)[np.where(codes < 0, len(labels), codes)]
    out[~np.asarray(gpu, dtype=bool)] = None
    return out


def family_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per rank and family: comm kernels matched and their summed time (ms); the patterns are the ones
    the trace was loaded with (`df.attrs["comm_kernels"]`)."""
    cols = ["rank", "family", "kernels", "kernel_ms"]
    # the comm kernels of those every view counts (gpu_steps), by a mask: only their rank, name and dur taken
    comm = counted_rows(df) & (df["kind"] == "comm").to_numpy()
    if not comm.any():
        return pd.DataFrame(columns=cols)
    fam = family_of(df["name"][comm], np.ones(int(comm.sum()), bool), df.attrs.get("comm_kernels", ()))
    rows = pd.DataFrame({"rank": df["rank"].to_numpy()[comm], "family": fam, "dur": df["dur"].to_numpy()[comm]})
    g = rows.groupby(["rank", "family"], as_index=False).agg(kernels=("dur", "size"), kernel_ms=("dur", "sum"))
    g["kernel_ms"] *= 1e-3
    return g[cols]


def family_lines(df: pd.DataFrame) -> list[str]:
    """The report's lines: which family matched how many kernels and how much time; a warning where a
    multi-rank job shows no comm kernel at all (never a silent 0)."""
    if not (df["device"] == "gpu").any():
        return []
    table = family_table(df)
    lines = [f"comm kernels: rank {r.rank} {r.family} {r.kernels} kernels {r.kernel_ms:.3f} ms (summed, "
             f"not merged)" for r in table.itertuples()]
    world = int(df.attrs.get("world_size") or 1)
    if world > 1 and not len(table):
        lines.append(f"warning: {df.attrs.get('path', 'the trace')}: distributedInfo.world_size is {world} but no "
                     f"GPU kernel matched a comm family ({', '.join(FAMILIES)}), so comm reads 0; name your "
                     f"comm kernels with --comm-kernels REGEX")
    return lines
