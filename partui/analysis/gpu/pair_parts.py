"""F&B pair parts of a torch.profiler trace on plain arrays (numpy, no pandas): `partui report --by pair`
on a Kineto file, whichever reader read it (the analysis table: kineto_pairs; the pandas-free report:
kineto_lean), so each figure is computed here once.

The parts are the user annotations that name them (PART_NAMES). Each is tied to the GPU kernels it
launched through launch correlation: a kernel's launch (kineto_kinds.launch_times: the CPU call carrying
its correlation id, on any thread of its process, since autograd launches a backward's kernels from its
own thread) made while the annotation was open makes the kernel the part's. Per part: its kernels' GPU
time (merged), its comm kernels' time, which other parts' compute kernels ran beside those comm kernels,
and what no compute kernel covered (exposed). The k-th annotation of a name on a rank is that part of
layer k (DeepSeek's profile runs 4 MoE layers a pair, in one order each).

Which annotation name means which part is PART_NAMES, data: add a framework's names as a row.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from partui.analysis.gpu.kineto_kinds import STEP_PREFIX
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
SIDE = re.compile(r"\(([FBW])\)")   # an annotation's side, as the summary and the planner read it
HOLDER_BLOCK = 4096   # parts matched against their holders this many at a time (bounds the memory)


@dataclass
class Annotations:
    """A trace's CPU user annotations (category user_annotation), in the analysis table's (rank, ts) order."""
    rank: np.ndarray    # int64
    ts: np.ndarray      # us
    end: np.ndarray
    dur: np.ndarray
    name: list          # each one's name (text)


@dataclass
class Parts:
    """The part annotations, in (rank, ts) order: what annotated_parts found."""
    rank: np.ndarray
    ts: np.ndarray
    end: np.ndarray
    name: list          # the annotation, e.g. "dispatch(F)"
    part: list          # the planner's part (PART_NAMES), e.g. "DISPATCH"
    layer: np.ndarray   # k: the k-th annotation of its name on its rank
    pair: list          # the name of the shortest other annotation holding it ("" where none)


@dataclass
class PairsRead:
    """A trace's parts, its --by pair table and its counted kernels with their parts, as read_pairs made them."""
    parts: Parts
    table: dict           # pair_columns' (COLUMNS, a list each)
    owner: np.ndarray     # per kernel: its part (part_owner; -1: none)
    k_rank: np.ndarray
    k_ts: np.ndarray
    k_end: np.ndarray


def read_pairs(a: Annotations, k_rank: np.ndarray, k_ts: np.ndarray, k_end: np.ndarray, k_comm: np.ndarray,
               launch: np.ndarray) -> PairsRead:
    """Everything --by pair prints, from a trace's user annotations and its counted kernels (rank, ts, end,
    comm flag, launch: kineto_kinds.launch_times'); both readers call this."""
    parts = annotated_parts(a)
    owner = part_owner(parts, k_rank, launch)
    table = pair_columns(parts, k_rank, k_ts, k_end, k_comm, owner) if len(parts.rank) else {c: [] for c in COLUMNS}
    return PairsRead(parts, table, owner, k_rank, k_ts, k_end)


def is_part_name(name: str) -> bool:
    """Whether an annotation's name is a part's (PART_NAMES; what tells a trace --by pair can read)."""
    return any(re.match(pattern, name) for pattern, _ in PART_NAMES)


def name_parts(names) -> list:
    """Per distinct name: its planner's part (the first PART_NAMES row whose pattern finds it), else None."""
    found = []
    for name in names:
        found.append(next((kind for pattern, kind in PART_NAMES if re.search(pattern, name)), None))
    return found


def annotated_parts(a: Annotations) -> Parts:
    """The part annotations among a, each with its layer and its pair (smallest_holders)."""
    distinct = list(dict.fromkeys(a.name))
    code = index_codes(a.name, distinct)
    kinds = name_parts(distinct)
    is_part = np.array([k is not None for k in kinds], dtype=bool)[code]
    is_step = np.array([n.startswith(STEP_PREFIX) for n in distinct], dtype=bool)[code]   # a step holds every part
    at = np.flatnonzero(is_part)
    at = at[np.lexsort((a.ts[at], a.rank[at]))]   # stable: the table's (rank, ts) order kept
    layer = np.zeros(len(at), dtype=np.int64)
    seen: dict = {}
    for i, key in enumerate(zip(a.rank[at].tolist(), code[at].tolist())):
        layer[i] = seen.get(key, 0)
        seen[key] = layer[i] + 1
    holders = np.flatnonzero(~is_part & ~is_step)
    rank, ts, end = a.rank[at], a.ts[at], a.end[at]
    pair = smallest_holders(rank, ts, end, a.rank[holders], a.ts[holders], a.end[holders], a.dur[holders],
                            [a.name[i] for i in holders.tolist()])
    return Parts(rank=rank, ts=ts, end=end, name=[a.name[i] for i in at.tolist()],
                 part=[kinds[c] for c in code[at].tolist()], layer=layer, pair=pair)


def index_codes(values: list, distinct: list) -> np.ndarray:
    """Each value's place in distinct."""
    place = {v: i for i, v in enumerate(distinct)}
    return np.array([place[v] for v in values], dtype=np.int64)


def smallest_holders(rank, ts, end, h_rank, h_ts, h_end, h_dur, h_name: list) -> list:
    """Per part (rank, ts, end), the name of the shortest holder on its rank spanning it ("" where none
    does; of equal durations the first in trace order), matched a block of parts at a time against
    every holder of the rank: [parts, holders] booleans, HOLDER_BLOCK rows at a time."""
    out = np.full(len(rank), "", dtype=object)
    names = np.array(h_name + [""], dtype=object)[:-1]
    for r in np.unique(h_rank):
        mine = np.flatnonzero(rank == r)
        if not len(mine):
            continue
        where = np.flatnonzero(h_rank == r)
        where = where[np.argsort(h_dur[where], kind="stable")]      # shortest first
        hts, hend, hname = h_ts[where], h_end[where], names[where]
        for lo in range(0, len(mine), HOLDER_BLOCK):
            rows = mine[lo:lo + HOLDER_BLOCK]
            spans = (hts[None, :] <= ts[rows, None]) & (hend[None, :] >= end[rows, None])   # [parts, holders]
            found = spans.any(axis=1)
            out[rows[found]] = hname[spans.argmax(axis=1)[found]]
    return out.tolist()


def part_owner(parts: Parts, k_rank: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """Per kernel, the index of the part annotation open at its launch (launch: kineto_kinds.launch_times;
    NaN: no CPU call claims it), -1 where none is: parts do not nest, so the last one begun at or before
    the launch, if the launch is inside it."""
    owner = np.full(len(k_rank), -1)
    for r in np.unique(parts.rank):
        mine = np.flatnonzero(parts.rank == r)
        at = np.flatnonzero((k_rank == r) & ~np.isnan(launch))
        t = launch[at]
        k = np.searchsorted(parts.ts[mine], t, side="right") - 1
        kk = np.clip(k, 0, None)
        inside = (k >= 0) & (t <= parts.end[mine][kk])
        owner[at] = np.where(inside, mine[kk], -1)
    return owner


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


def pair_columns(parts: Parts, k_rank: np.ndarray, k_ts: np.ndarray, k_end: np.ndarray, k_comm: np.ndarray,
                 owner: np.ndarray) -> dict:
    """The --by pair table (COLUMNS, a list each): a row per part annotation of a rank with kernels, ranks in
    order, its GPU time, the comm kernels it launched, which other parts' compute kernels ran under them and
    what stayed exposed. k_*: the counted kernels (gpu_kernels.Kernels' rank, ts, end, comm); owner:
    part_owner's. Each kernel is visited a constant number of times: kernels are grouped by part once, and
    the compute kernels beside an all-to-all are found by binary search in start order."""
    out = {c: [] for c in COLUMNS}
    label = [f"{n} L{k}" for n, k in zip(parts.name, parts.layer.tolist())]
    for rank in np.unique(k_rank).tolist():
        rows = np.flatnonzero(k_rank == rank)
        ts, end, comm, own_part = k_ts[rows], k_end[rows], k_comm[rows], owner[rows]
        compute = np.flatnonzero(~comm)
        compute = compute[np.argsort(ts[compute], kind="stable")]
        # the interval lists as Python floats (tolist): the merges' comparisons and sums, the same
        # values and order, run ~3x faster than over numpy scalars
        busy = Covered(merge(list(zip(ts[compute].tolist(), end[compute].tolist()))))
        c_ts, c_end, c_part = ts[compute], end[compute], own_part[compute]
        longest = float((c_end - c_ts).max()) if len(c_ts) else 0.0
        by_part = np.argsort(own_part, kind="stable")    # each part's kernels, in table order
        bounds = np.searchsorted(own_part[by_part], np.arange(len(parts.rank) + 1))
        for pid in np.flatnonzero(parts.rank == rank).tolist():
            own = by_part[bounds[pid]:bounds[pid + 1]]
            mine = own[comm[own]]
            flight = merge(list(zip(ts[mine].tolist(), end[mine].tolist())))
            under_ids = set()
            for a, b in flight:     # compute kernels of other parts running during [a, b)
                lo = np.searchsorted(c_ts, a - longest, side="right")
                hi = np.searchsorted(c_ts, b, side="left")
                hit = (c_end[lo:hi] > a) & (c_part[lo:hi] != pid) & (c_part[lo:hi] >= 0)
                under_ids.update(c_part[lo:hi][hit].tolist())
            covered = busy.within(flight)
            for c, v in (("rank", rank), ("pair", parts.pair[pid]), ("layer_k", int(parts.layer[pid])),
                         ("part", parts.part[pid]), ("annotation", parts.name[pid]), ("launched", len(own)),
                         ("gpu_ms", length(merge(list(zip(ts[own].tolist(), end[own].tolist())))) * 1e-3),
                         ("a2a_ms", length(flight) * 1e-3), ("a2a_under_ms", covered * 1e-3),
                         ("a2a_exposed_ms", (length(flight) - covered) * 1e-3),
                         ("under", ", ".join(label[i] for i in sorted(under_ids)))):
                out[c].append(v)
    return out


def pair_summary(table: dict) -> str:
    """One line: the parts' comm time, what compute ran under, what stayed exposed (table: pair_columns')."""
    if not len(table["rank"]):
        return ("no part annotations in this torch.profiler trace (names as pair_parts.PART_NAMES lists, "
                "e.g. attn(F), dispatch(B), mlp(W)); add your framework's names there")
    comm, under, exposed = (float(np.sum(table[c])) for c in ("a2a_ms", "a2a_under_ms", "a2a_exposed_ms"))
    sides = "".join(sorted({m.group(1) for m in map(SIDE.search, table["annotation"]) if m}))
    return (f"F&B parts: {len(table['rank'])} annotations over {len(set(table['layer_k']))} layers (sides {sides}); "
            f"their comm kernels {comm:.3f} ms = under compute {under:.3f} ms ({share(under, comm)}) + exposed "
            f"{exposed:.3f} ms ({share(exposed, comm)}, no compute kernel running)")


def recorded_window_ms(owner: np.ndarray, k_rank: np.ndarray, k_ts: np.ndarray, k_end: np.ndarray,
                       rank: int) -> float:
    """The GPU window of the kernels a rank's parts launched (owner >= 0), in ms."""
    mine = (owner >= 0) & (k_rank == rank)
    return float(k_end[mine].max() - k_ts[mine].min()) * 1e-3 if mine.any() else 0.0


def rows_of(table: dict, rank: int) -> dict:
    """A rank's rows of a pair_columns table."""
    keep = [i for i, r in enumerate(table["rank"]) if r == rank]
    return {c: [v[i] for i in keep] for c, v in table.items()}


def share(part: float, whole: float) -> str:
    """A share as printed: '-' where there is no whole to share (no all-to-all: nothing was hidden or not)."""
    return f"{100 * part / whole:.1f}%" if whole else "-"
