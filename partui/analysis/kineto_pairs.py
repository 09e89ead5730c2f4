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

from planning.intervals import intersect, length, merge

# (annotation name pattern with a `side` group F / B / W, the planner's part: planning/pipeline/fb_order.py)
PART_NAMES = [
    (r"^attn\((?P<side>[FBW])\)$", "ATTN"),          # DeepSeek's DualPipe profile (deepseek-ai/profile-data)
    (r"^mlp\((?P<side>[FBW])\)$", "MLP"),
    (r"^dispatch\((?P<side>[FB])\)$", "DISPATCH"),
    (r"^combine\((?P<side>[FB])\)$", "COMBINE"),
]
COLUMNS = ["rank", "pair", "layer_k", "part", "annotation", "launched", "gpu_ms", "a2a_ms", "a2a_under_ms",
           "a2a_exposed_ms", "under"]


def annotated_parts(df: pd.DataFrame) -> pd.DataFrame:
    """The part annotations: rank, tid, ts, end, name, part, side, layer (k-th of its name), pair (the
    smallest other annotation holding it, e.g. DeepSeek's "1F1B")."""
    cpu = df[(df["device"] == "cpu") & (df["cat"].astype(str) == "user_annotation")]
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
    pair = []
    for r in parts.itertuples():
        held = holders[(holders["rank"] == r.rank) & (holders["ts"] <= r.ts) & (holders["end"] >= r.end)]
        pair.append(str(held.loc[held["dur"].idxmin(), "name"]) if len(held) else "")
    return parts.assign(pair=pair).reset_index(drop=True)


def part_kernels(df: pd.DataFrame, parts: pd.DataFrame) -> pd.DataFrame:
    """The GPU kernels (compute and comm) with the index of the part annotation that launched them (-1:
    launched outside every part)."""
    gpu = df[(df["device"] == "gpu") & df["kind"].isin(["compute", "comm"])]
    runtime = df[(df["cat"].astype(str) == "cuda_runtime") & df["correlation"].notna()]
    owner = np.full(len(runtime), -1)
    for rank, mine in parts.groupby("rank"):   # any thread: autograd launches a backward's kernels off the main one
        at = (runtime["rank"] == rank).to_numpy()
        ts = runtime["ts"].to_numpy()[at]
        k = np.searchsorted(mine["ts"].to_numpy(), ts, side="right") - 1   # parts do not nest: one at a time
        inside = (k >= 0) & (ts <= mine["end"].to_numpy()[np.clip(k, 0, None)])
        owner[np.flatnonzero(at)] = np.where(inside, mine.index.to_numpy()[np.clip(k, 0, None)], -1)
    launched = pd.Series(owner, index=pd.MultiIndex.from_arrays([runtime["rank"], runtime["correlation"]]))
    launched = launched[~launched.index.duplicated()]
    key = pd.MultiIndex.from_arrays([gpu["rank"], gpu["correlation"]])
    return gpu.assign(part_id=launched.reindex(key).fillna(-1).astype(int).to_numpy())


def kineto_pairs(df: pd.DataFrame) -> pd.DataFrame:
    """One row per part annotation (COLUMNS): its GPU time, the comm kernels it launched, which other parts'
    compute kernels ran under them and what stayed exposed. Empty without part annotations."""
    parts = annotated_parts(df)
    if not len(parts):
        return pd.DataFrame(columns=COLUMNS)
    kernels = part_kernels(df, parts)
    rows = []
    for rank, mine in kernels.groupby("rank"):
        compute = mine[mine["kind"] == "compute"]
        busy = merge(list(zip(compute["ts"], compute["end"])))
        for pid, p in parts[parts["rank"] == rank].iterrows():
            own = mine[mine["part_id"] == pid]
            comm = own[own["kind"] == "comm"]
            flight = merge(list(zip(comm["ts"], comm["end"])))
            beside = compute[(compute["part_id"] != pid) & (compute["part_id"] >= 0)]
            hit = np.zeros(len(beside), bool)
            for a, b in flight:
                hit |= (beside["ts"].to_numpy() < b) & (beside["end"].to_numpy() > a)
            under = parts.loc[sorted(set(beside["part_id"].to_numpy()[hit]))]
            covered = intersect(busy, flight)
            rows.append({"rank": rank, "pair": p["pair"], "layer_k": int(p["layer"]), "part": p["part"],
                         "annotation": str(p["name"]), "launched": len(own),
                         "gpu_ms": length(merge(list(zip(own["ts"], own["end"])))) * 1e-3,
                         "a2a_ms": length(flight) * 1e-3, "a2a_under_ms": covered * 1e-3,
                         "a2a_exposed_ms": (length(flight) - covered) * 1e-3,
                         "under": ", ".join(f"{n} L{k}" for n, k in zip(under["name"].astype(str), under["layer"]))})
    return pd.DataFrame(rows, columns=COLUMNS)


def kineto_pair_summary(table: pd.DataFrame) -> str:
    """One line: the parts' comm time, what compute ran under, what stayed exposed."""
    if not len(table):
        return ("no part annotations in this torch.profiler trace (names as kineto_pairs.PART_NAMES lists, "
                "e.g. attn(F), dispatch(B), mlp(W)); add your framework's names there")
    comm, under, exposed = (table[c].sum() for c in ("a2a_ms", "a2a_under_ms", "a2a_exposed_ms"))
    sides = "".join(sorted(set(table["annotation"].str.extract(r"\(([FBW])\)", expand=False).dropna())))
    return (f"F&B parts: {len(table)} annotations over {table['layer_k'].nunique()} layers (sides {sides}); their "
            f"comm kernels {comm:.3f} ms, under other parts' compute {under:.3f} ms "
            f"({100 * under / comm if comm else 0:.1f}%), exposed {exposed:.3f} ms (no compute kernel running)")


def is_part_trace(df: pd.DataFrame) -> bool:
    """A torch.profiler trace with part annotations (then --by pair reads them)."""
    if df.attrs.get("format") != "kineto":
        return False
    names = df.loc[df["cat"].astype(str) == "user_annotation", "name"].astype(str)
    return any(names.str.match(pattern).any() for pattern, _ in PART_NAMES)

