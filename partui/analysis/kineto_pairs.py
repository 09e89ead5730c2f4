"""F&B pair parts of a torch.profiler trace, from the user annotations that name them (`partui report
--by pair` on a Kineto file): each annotation is tied to the GPU kernels it launched through launch
correlation (a cuda_runtime launch made while the annotation was open, on any thread of its process,
since autograd launches a backward's kernels from its own thread, carries the kernel's `correlation` id,
the same link the `ac2g` flows draw).

Per part: its kernels' GPU time (merged), its comm kernels' time, which other parts' compute kernels ran
beside those comm kernels, and what no compute kernel covered (exposed). The k-th annotation of a name on
a rank is that part of layer k (DeepSeek's profile runs 4 MoE layers a pair, in one order each).

Which annotation name means which part is PART_NAMES, data: add a framework's names as a row.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.gpu_steps import counted_kernels, launch_times
from planning.intervals import length, merge

# (annotation name pattern with a `side` group F / B / W, the planner's part: planning/pipeline/fb_order.py)
PART_NAMES = [
    (r"^attn\((?P<side>[FBW])\)$", "ATTN"),          # DeepSeek's DualPipe profile (deepseek-ai/profile-data)
    (r"^mlp\((?P<side>[FBW])\)$", "MLP"),
    (r"^dispatch\((?P<side>[FB])\)$", "DISPATCH"),
    (r"^combine\((?P<side>[FB])\)$", "COMBINE"),
]
COLUMNS = ["rank", "pair", "layer_k", "part", "annotation", "launched", "gpu_ms", "a2a_ms", "a2a_under_ms",
           "a2a_exposed_ms", "under"]


HOLDER_BLOCK = 4096   # parts matched against their holders this many at a time (bounds the memory)


def annotated_parts(df: pd.DataFrame) -> pd.DataFrame:
    """The part annotations: rank, tid, ts, end, name, part, side, layer (k-th of its name), pair (the
    smallest other annotation holding it, e.g. DeepSeek's "1F1B")."""
    cpu = df[(df["device"] == "cpu") & (df["cat"] == "user_annotation")]  # categorical: codes compared
    names = cpu["name"].astype(str)
    part = pd.Series(None, index=cpu.index, dtype=object)
    side = pd.Series(None, index=cpu.index, dtype=object)
    for pattern, kind in PART_NAMES:
        got = names.str.extract(pattern)["side"]
        hit = got.notna() & part.isna()
        part[hit], side[hit] = kind, got[hit]
    parts = cpu.assign(part=part, side=side)[part.notna()].sort_values(["rank", "ts"])
    parts["layer"] = parts.groupby(["rank", "name"], observed=True).cumcount()
    holders = cpu[part.isna() & ~names.str.startswith("ProfilerStep#")]
    return parts.assign(pair=smallest_holders(parts, holders)).reset_index(drop=True)


def smallest_holders(parts: pd.DataFrame, holders: pd.DataFrame) -> np.ndarray:
    """Per part, the name of the shortest holder on its rank spanning it ("" where none does; of equal
    durations the first in trace order), matched a block of parts at a time against every holder."""
    out = np.full(len(parts), "", dtype=object)
    rows = parts.groupby("rank", sort=False).indices
    for rank, where in holders.groupby("rank", sort=False).indices.items():
        mine = rows.get(rank)
        if mine is None:
            continue
        h = holders.iloc[where]
        by_dur = np.argsort(h["dur"].to_numpy(), kind="stable")      # shortest first
        h_ts, h_end = h["ts"].to_numpy()[by_dur], h["end"].to_numpy()[by_dur]
        h_name = h["name"].astype(str).to_numpy()[by_dur]
        p_ts, p_end = parts["ts"].to_numpy()[mine], parts["end"].to_numpy()[mine]
        for lo in range(0, len(mine), HOLDER_BLOCK):
            ts, end = p_ts[lo:lo + HOLDER_BLOCK, None], p_end[lo:lo + HOLDER_BLOCK, None]
            spans = (h_ts[None, :] <= ts) & (h_end[None, :] >= end)   # [parts, holders]
            found = spans.any(axis=1)
            out[mine[lo:lo + HOLDER_BLOCK][found]] = h_name[spans.argmax(axis=1)[found]]
    return out


def part_kernels(df: pd.DataFrame, parts: pd.DataFrame) -> pd.DataFrame:
    """The kernels every view counts (gpu_steps.counted_kernels) with the index of the part annotation
    that launched them (-1: launched outside every part). A kernel's launch is gpu_steps.launch_times':
    any CPU-side call carrying its correlation id, whatever its API (runtime, driver, graph, HIP), on
    any thread of the rank (autograd launches a backward's kernels off the main one)."""
    gpu = counted_kernels(df)
    launch = launch_times(df, gpu)
    owner = np.full(len(gpu), -1)
    rank = gpu["rank"].to_numpy()
    for r, mine in parts.groupby("rank"):
        at = (rank == r) & ~np.isnan(launch)
        ts = launch[at]
        k = np.searchsorted(mine["ts"].to_numpy(), ts, side="right") - 1   # parts do not nest: one at a time
        inside = (k >= 0) & (ts <= mine["end"].to_numpy()[np.clip(k, 0, None)])
        owner[np.flatnonzero(at)] = np.where(inside, mine.index.to_numpy()[np.clip(k, 0, None)], -1)
    return gpu.assign(part_id=owner)


class Covered:
    """A union of disjoint sorted intervals, asked how much of [a, b) it covers in O(log n) a query."""

    def __init__(self, union: list[tuple[float, float]]):
        self.start = np.array([a for a, _ in union], dtype=float)
        self.end = np.array([b for _, b in union], dtype=float)
        self.before = np.concatenate([[0.0], np.cumsum(self.end - self.start)])   # length before each

    def upto(self, x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self.start, x, side="right")       # intervals starting at or before x
        last = np.clip(k - 1, 0, None)
        tail = np.clip(np.minimum(x, self.end[last]) - self.start[last], 0, None) if len(self.start) else 0.0
        return np.where(k > 0, self.before[last] + tail, 0.0)

    def within(self, flight: list[tuple[float, float]]) -> float:
        if not flight or not len(self.start):
            return 0.0
        a, b = np.array(flight, dtype=float).T
        return float((self.upto(b) - self.upto(a)).sum())


def kineto_pairs(df: pd.DataFrame) -> pd.DataFrame:
    """One row per part annotation (COLUMNS): its GPU time, the comm kernels it launched, which other parts'
    compute kernels ran under them and what stayed exposed. Empty without part annotations. Each kernel
    is visited a constant number of times: kernels are grouped by part once, and the compute kernels
    beside an all-to-all are found by binary search in start order."""
    parts = annotated_parts(df)
    if not len(parts):
        return pd.DataFrame(columns=COLUMNS)
    kernels = part_kernels(df, parts)
    label = dict(zip(parts.index, (f"{n} L{k}" for n, k in zip(parts["name"].astype(str), parts["layer"]))))
    rows = []
    for rank, mine in kernels.groupby("rank"):
        is_compute = (mine["kind"] == "compute").to_numpy()  # categorical: codes compared, once a rank
        compute = mine[is_compute].sort_values("ts")
        # the interval lists as Python floats (tolist): the merges' comparisons and sums, the same
        # values and order, run ~3x faster than over numpy scalars
        busy = Covered(merge(list(zip(compute["ts"].tolist(), compute["end"].tolist()))))
        c_ts, c_end, c_part = (compute[c].to_numpy() for c in ("ts", "end", "part_id"))
        longest = float((c_end - c_ts).max()) if len(c_ts) else 0.0
        own_of = mine.groupby("part_id").indices
        ts, end = mine["ts"].to_numpy(), mine["end"].to_numpy()
        is_comm = (mine["kind"] == "comm").to_numpy()
        mine_parts = parts[parts["rank"] == rank]
        for pid, pair, layer, part, name in zip(mine_parts.index, mine_parts["pair"], mine_parts["layer"],
                                                mine_parts["part"], mine_parts["name"].astype(str)):
            own = own_of.get(pid, np.array([], dtype=int))
            comm = own[is_comm[own]]
            flight = merge(list(zip(ts[comm].tolist(), end[comm].tolist())))
            under_ids = set()
            for a, b in flight:     # compute kernels of other parts running during [a, b)
                lo = np.searchsorted(c_ts, a - longest, side="right")
                hi = np.searchsorted(c_ts, b, side="left")
                hit = (c_end[lo:hi] > a) & (c_part[lo:hi] != pid) & (c_part[lo:hi] >= 0)
                under_ids.update(c_part[lo:hi][hit].tolist())
            covered = busy.within(flight)
            rows.append({"rank": rank, "pair": pair, "layer_k": int(layer), "part": part,
                         "annotation": name, "launched": len(own),
                         "gpu_ms": length(merge(list(zip(ts[own].tolist(), end[own].tolist())))) * 1e-3,
                         "a2a_ms": length(flight) * 1e-3, "a2a_under_ms": covered * 1e-3,
                         "a2a_exposed_ms": (length(flight) - covered) * 1e-3,
                         "under": ", ".join(label[i] for i in sorted(under_ids))})
    return pd.DataFrame(rows, columns=COLUMNS)


def kineto_pair_summary(table: pd.DataFrame) -> str:
    """One line: the parts' comm time, what compute ran under, what stayed exposed."""
    if not len(table):
        return ("no part annotations in this torch.profiler trace (names as kineto_pairs.PART_NAMES lists, "
                "e.g. attn(F), dispatch(B), mlp(W)); add your framework's names there")
    comm, under, exposed = (table[c].sum() for c in ("a2a_ms", "a2a_under_ms", "a2a_exposed_ms"))
    sides = "".join(sorted(set(table["annotation"].str.extract(r"\(([FBW])\)", expand=False).dropna())))
    return (f"F&B parts: {len(table)} annotations over {table['layer_k'].nunique()} layers (sides {sides}); their "
            f"comm kernels {comm:.3f} ms = under compute {under:.3f} ms ({_pct(under, comm)}) + exposed "
            f"{exposed:.3f} ms ({_pct(exposed, comm)}, no compute kernel running)")


def is_part_trace(df: pd.DataFrame) -> bool:
    """A torch.profiler trace with part annotations (then --by pair reads them)."""
    if df.attrs.get("format") != "kineto":
        return False
    names = df.loc[df["cat"] == "user_annotation", "name"].astype(str)
    return any(names.str.match(pattern).any() for pattern, _ in PART_NAMES)



def _pct(part: float, whole: float) -> str:
    """A share as printed: '-' where there is no whole to share (no all-to-all: nothing was hidden or not)."""
    return f"{100 * part / whole:.1f}%" if whole else "-"
