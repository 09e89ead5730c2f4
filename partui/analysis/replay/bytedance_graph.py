"""The step graphs of an op-level table of a Megatron-style job (the ByteDance straggler artifact's
columns, parquet or csv: partui.analysis.reading.op_table), built with array operations, no Python loop
per op: a thousand ranks' steps in a few seconds (partui bench blame-scale).

Rules of the ByteDance format's graph (the paper's dependency model, "Understanding Stragglers in
Large Model Training Using What-if Analysis"), per step and rank:
    lanes        compute (forward/backward compute in recorded order), one per p2p stream
                 (forward-send, forward-recv, backward-send, backward-recv), post (params
                 all-gather, gc, layernorm all-reduce, embedding all-reduce, grads reduce-scatter,
                 clip, optimizer: the step's tail in that order)
    p2p          the k-th forward-send of stage s pairs with the k-th forward-recv of stage s+1
                 (backward: s with s-1), same dp rank; a send waits for its compute k; compute k
                 waits for its recv k, recv k for compute k-1; the first backward send/recv for
                 the forward compute two before the first backward compute
    collectives  params all-gather and grads reduce-scatter: across the dp ranks of a stage;
                 embedding all-reduce: first and last stage of a dp rank; clip: every rank
    tail         the first forward compute waits for the params all-gather; gc (or the tail's
                 first op) for the last compute to end
A collective's members all end at the last member's arrival plus their own transfer time, the
recorded end less the last member's recorded start (0 if negative); every other op lasts its
recorded duration. Launch gaps (an op starting later than its dependencies allow) are not in the
graph: replaying it as recorded gives the step without them.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd

from partui.analysis.table.events import TraceError
from partui.analysis.replay.graph_replay import NodeTable
from partui.analysis.reading.op_table import OP_COLUMNS
from partui.analysis.replay.opgraph import StepGraph

P2P = {"forward-send": ("forward-recv", 1), "forward-recv": ("forward-send", -1),
       "backward-send": ("backward-recv", -1), "backward-recv": ("backward-send", 1)}
TAIL = ("params-all-gather", "gc", "layernorm-grads-all-reduce", "embedding-grads-all-reduce",
        "grads-reduce-scatter", "separate-grads-all-reduce", "optimizer-clip-main-grad", "optimizer")
DP_SYNCED = ("params-all-gather", "grads-reduce-scatter", "separate-grads-all-reduce")
# "typical" duration: the paper takes the mean for compute and the median for communication
COMM_TYPES = set(P2P) | set(DP_SYNCED) | {"layernorm-grads-all-reduce",
                                          "embedding-grads-all-reduce", "optimizer-clip-main-grad"}
KIND_OF = {"forward-send": "forward-pp-comm", "forward-recv": "forward-pp-comm",
           "backward-send": "backward-pp-comm", "backward-recv": "backward-pp-comm"}


def _transfer(df: pd.DataFrame, key: pd.Series) -> np.ndarray:
    """Per op: recorded end less its group's last recorded start (0 if negative); a non-collective
    keeps its duration."""
    end = (df["start_ts"] + df["duration"]).to_numpy(float)
    last = df.groupby(key)["start_ts"].transform("max").to_numpy(float)
    out = np.maximum(end - last, 0.0)
    return np.where(key.isna().to_numpy(), df["duration"].to_numpy(float), out)


TYPES = ("forward-compute", "backward-compute") + tuple(P2P) + TAIL
LANE_NAMES = ("compute",) + tuple(P2P) + ("post",)
LANE_OF = {t: 0 if i < 2 else i - 1 if i < 6 else 5 for i, t in enumerate(TYPES)}


def _group_keys(df: pd.DataFrame, tc: np.ndarray) -> np.ndarray:
    """Per op: (kind, type or direction, step, two coordinates, k) of the collective it is a
    member of; kind 0: not a collective. Rows as a (n, 6) int array."""
    n = len(df)
    step, st, dp, k = (df[c].to_numpy(np.int64) for c in ("step", "stage", "dp_rank", "k"))
    kind = np.zeros(n, np.int64)
    a, b = np.zeros(n, np.int64), np.zeros(n, np.int64)
    code = {t: i for i, t in enumerate(TYPES)}
    p2p = (tc >= 2) & (tc < 6)
    backward = np.isin(tc, [code["backward-send"], code["backward-recv"]])
    delta = np.where(tc == code["forward-recv"], -1, np.where(tc == code["backward-recv"], 1, 0))
    kind[p2p], a[p2p], b[p2p] = 1, (st + delta + 1)[p2p], dp[p2p]      # +1: stage -1 stays >= 0
    dps = np.isin(tc, [code[t] for t in DP_SYNCED])
    kind[dps], a[dps] = 2, st[dps]
    emb = tc == code["embedding-grads-all-reduce"]
    kind[emb], a[emb] = 3, dp[emb]
    kind[tc == code["optimizer-clip-main-grad"]] = 4
    sub = np.where(p2p, backward, np.where(dps, tc, 0))     # direction for p2p, type for dp-synced
    return np.stack([kind, sub, step, a, b, np.where(kind > 0, k, 0)], axis=1)


def _mixed(keys: np.ndarray) -> np.ndarray:
    """Rows of non-negative ints -> one int64 each, equal iff the rows are."""
    span = keys.max(axis=0) + 1 if len(keys) else np.ones(keys.shape[1], np.int64)
    out = np.zeros(len(keys), np.int64)
    for j in range(keys.shape[1]):
        out = out * int(span[j]) + keys[:, j]
    return out


def bytedance_graphs(df: pd.DataFrame) -> list[StepGraph]:
    """The step graphs of an op-level trace (read_op_table), one per step, in step order, built
    with array operations (no Python loop per op)."""
    cat = df["optype"].astype("category")               # the artifact's own dtype: no copy
    names = [str(c) for c in cat.cat.categories]
    code = {t: i for i, t in enumerate(TYPES)}
    # per category: its type code; -1 not in the model; -2 "first-op" (a marker row, dropped)
    of_cat = np.array([code.get(n, -2 if n == "first-op" else -1) for n in names] + [-1])
    tc = of_cat[cat.cat.codes.to_numpy()]
    keep = tc != -2
    df = df.loc[keep, list(OP_COLUMNS)]
    order = np.lexsort(tuple(df[c].to_numpy() for c in ("seq_id", "start_ts", "rank", "step")))
    df = df.iloc[order].reset_index(drop=True)
    tc, labels = tc[keep][order], np.array(names + ["?"], dtype=object)[cat.cat.codes.to_numpy()][keep][order]
    steps, ranks = df["step"].to_numpy(), df["rank"].to_numpy()
    block = np.r_[0, np.cumsum((steps[1:] != steps[:-1]) | (ranks[1:] != ranks[:-1]))]
    known = tc >= 0
    if not known.all():
        bad = block == block[np.argmin(known)]
        other = sorted(set(labels[bad & ~known]))
        raise TraceError(f"rank {int(ranks[bad][0])}: op type(s) {other} not in the dependency "
                         f"model (known: compute, {', '.join(P2P)}, {', '.join(TAIL)})")
    df["k"] = pd.Series(block * len(TYPES) + tc).groupby(block * len(TYPES) + tc).cumcount()
    keys = _group_keys(df, tc)
    coll = keys[:, 0] > 0
    gid = np.full(len(df), -1, np.int64)
    _, inv, counts = np.unique(_mixed(keys[coll]), return_inverse=True, return_counts=True)
    gid[coll] = inv.ravel()
    transfer = _transfer(df, pd.Series(np.where(coll, gid, np.nan)))
    grouped = coll & (np.r_[counts, 0][gid] >= 2)               # gid -1: the 0 at the end
    df["end"] = df["start_ts"] + df["duration"]
    rows = _NodeRows(df, block, tc, grouped, transfer)
    rec = df.groupby("step").agg(a=("start_ts", "min"), b=("end", "max"))
    gname = _mixed(keys[:, [0, 1, 3, 4, 5]])                # no step: same-shaped steps batch
    out = []
    for s in np.unique(steps):
        t = rows.table(steps == s, gname)
        if out:                                 # a step shaped as the last shares its arrays
            t = _share(out[-1].table, t)
        g = StepGraph(int(s), table=t)
        g.recorded = float(rec.loc[s, "b"] - rec.loc[s, "a"])
        out.append(g)
    return out


def _ids(t: NodeTable) -> list:
    """A ByteDance table's node ids: (rank, optype, k); a marker's ("arrive", ...) of its op's
    (the node after it)."""
    real = np.where(t.marker, np.minimum(np.arange(len(t)) + 1, len(t) - 1), np.arange(len(t)))
    opt = t.optype[real]
    return [("arrive", r, TYPES[o], k) if m else (r, TYPES[o], k)
            for r, o, k, m in zip(t.rank.tolist(), opt.tolist(), t.k.tolist(), t.marker.tolist())]


_STRUCTURE = ("lane", "optype", "kind", "rank", "dp", "stage", "marker", "measured", "holds",
              "eager", "group", "dep_ptr", "dep_idx")


def _share(prev: NodeTable, t: NodeTable) -> NodeTable:
    """t with each structural array equal to prev's replaced by prev's own (memory: a thousand
    ranks' steps differ only in their durations)."""
    for name in _STRUCTURE + ("k",):
        a, b = getattr(prev, name), getattr(t, name)
        if a.shape == b.shape and np.array_equal(a, b):
            setattr(t, name, a)
    return t


class _NodeRows:
    """The nodes of every step in graph order (per rank: compute, each p2p stream, the tail; a
    collective member as an arrival marker, then the op) and their dependencies (module doc)."""

    def __init__(self, df, block, tc, grouped, transfer):
        n = len(df)
        self.transfer = np.asarray(transfer, float)
        self.rank, self.dp, self.stage = (df[c].to_numpy(np.int64)
                                          for c in ("rank", "dp_rank", "stage"))
        k = df["k"].to_numpy(np.int64)
        lane = np.array([LANE_OF[t] for t in TYPES])[tc]
        tail_at = np.where(tc >= 6, tc - 6, 0)
        within = np.where(lane == 5, tail_at * (int(k.max()) + 1) + k, np.arange(n))
        order = np.lexsort((within, lane, block))
        per = 1 + grouped[order]
        real = np.empty(n, np.int64)
        real[order] = np.cumsum(per) - 1
        carrier = np.where(grouped, real - 1, real)
        self.df, self.block, self.tc, self.k, self.lane = df, block, tc, k, lane
        self.grouped, self.real, self.order, self.total = grouped, real, order, int(per.sum())
        self.deps = self._deps(carrier)

    def _deps(self, carrier):
        """(carrier node, target node) pairs in the order the paper's model adds them."""
        block, tc, k, lane = self.block, self.tc, self.k, self.lane
        n = len(tc)
        kk = int(k.max()) + 1
        key = (block * len(TYPES) + tc) * kk + k
        srt = np.argsort(key, kind="stable")
        sk = key[srt]

        def find(b, t, kw):
            want = (b * len(TYPES) + t) * kk + kw
            pos = np.minimum(np.searchsorted(sk, want), n - 1)
            ok = (kw >= 0) & (kw < kk) & (sk[pos] == want)
            return np.where(ok, srt[pos], -1)

        pairs = []                              # (priority, carrier row, target row)
        rows = np.arange(n)
        for pri, t in enumerate(P2P):
            x = rows[tc == TYPES.index(t)]
            comp = 0 if t.startswith("forward") else 1
            if t.endswith("send"):
                pairs.append((pri, x, find(block[x], comp, k[x])))
            else:
                pairs.append((pri, find(block[x], comp, k[x]), x))
                pairs.append((pri, x, find(block[x], comp, k[x] - 1)))
        is_comp = lane == 0
        cpos = np.zeros(n, np.int64)
        cpos[is_comp] = pd.Series(block[is_comp]).groupby(block[is_comp]).cumcount().to_numpy()
        cmax = int(cpos.max()) + 1
        ckey = block * cmax + cpos
        comp_rows = rows[is_comp]
        first_b = pd.Series(cpos[tc == 1]).groupby(block[tc == 1]).min()
        fb = first_b[first_b >= 2]
        if len(fb):
            bl = fb.index.to_numpy()
            ci = np.searchsorted(ckey[comp_rows], bl * cmax + fb.to_numpy() - 2)
            two_before = comp_rows[ci]
            for t in ("backward-send", "backward-recv"):
                pairs.append((4, find(bl, TYPES.index(t), np.zeros_like(bl)), two_before))
        pag = rows[(tc == TYPES.index("params-all-gather")) & (k == 0)]
        pairs.append((5, find(block[pag], 0, np.zeros_like(pag)), pag))
        ends = self.df["end"].to_numpy()
        last = pd.Series(ends[is_comp], index=comp_rows).groupby(block[is_comp]).idxmax()
        post = rows[(lane == 5) & (tc != TYPES.index("params-all-gather"))]
        if len(post):                           # the tail's first op (TAIL order, then k)
            post = post[np.lexsort(((tc[post] - 6) * kk + k[post], block[post]))]
            post = post[np.r_[True, block[post][1:] != block[post][:-1]]]
            has = np.isin(block[post], last.index.to_numpy())
            pairs.append((6, post[has], last.loc[block[post][has]].to_numpy()))
        pri = np.concatenate([np.full(len(c), p) for p, c, _t in pairs])
        car = np.concatenate([c for _p, c, _t in pairs]).astype(np.int64)
        tgt = np.concatenate([t for _p, _c, t in pairs]).astype(np.int64)
        ok = (car >= 0) & (tgt >= 0)
        car_node, tgt_node = carrier[car[ok]], self.real[tgt[ok]]
        by = np.lexsort((pri[ok], car_node))
        return car_node[by], tgt_node[by]

    def table(self, rows_mask: np.ndarray, gname: list) -> NodeTable:
        """The NodeTable of the rows in rows_mask (one step, contiguous in graph order)."""
        order = self.order
        sel = order[rows_mask[order]]                       # rows in graph order
        grouped = self.grouped[sel]
        base = self.real[sel[0]] - int(grouped[0])          # the step's first node
        count = int(len(sel) + grouped.sum())
        node_row = np.repeat(sel, 1 + grouped)              # each node's row
        first_of = np.r_[True, node_row[1:] != node_row[:-1]]
        is_marker = first_of & np.repeat(grouped, 1 + grouped)
        r = self.rank[node_row]
        ln = self.lane[node_row]
        lane, lane_first = pd.factorize(r * 6 + ln)
        lanes = [(int(x) // 6, LANE_NAMES[int(x) % 6]) for x in lane_first]
        tcn = np.where(is_marker, len(TYPES), self.tc[node_row])
        optype, optypes = tcn, list(TYPES) + ["arrive"]
        kinds = list(dict.fromkeys(KIND_OF.get(t, t) for t in TYPES)) + [""]
        kind = np.array([kinds.index(KIND_OF.get(t, t)) for t in TYPES] + [len(kinds) - 1])[tcn]
        gn = np.where(self.grouped[node_row] & ~is_marker, gname[node_row], -1)
        group = np.full(count, -1, np.int64)
        gcodes, groups = pd.factorize(gn[gn >= 0])
        group[gn >= 0] = gcodes
        dcar, dtgt = self.deps
        lo, hi = np.searchsorted(dcar, [base, base + count])
        dcar, dtgt = dcar[lo:hi] - base, dtgt[lo:hi] - base
        dep_ptr = np.r_[0, np.cumsum(np.bincount(dcar, minlength=count))].astype(np.int64)
        dur = np.where(is_marker, 0.0, self.transfer[node_row])
        t = NodeTable(lane.astype(np.int64), lanes, dur, optype.astype(np.int64), optypes,
                      kind.astype(np.int64), kinds, r, self.dp[node_row], self.stage[node_row],
                      is_marker, np.ones(count, bool), np.ones(count, bool), np.ones(count, bool),
                      group, list(groups), dep_ptr, dtgt.astype(np.int64), None)
        t.k = self.k[node_row]                  # the op's index among its type's on its rank
        t.ids = partial(_ids, t)
        return t
