"""A step graph as arrays, and its replay one dependency level at a time: every op of a level (and
every what-if column) in a few numpy operations, so each op is touched a constant number of times
whatever the world's size. Blame's figures come from here; planning/replay.py (the event loop,
with causes) still gives the critical path of the one step it draws.

The rules are planning/replay.py's for the ops a step graph holds (no floor, no finish, lag 0):
    reached   the end of the lane's previous holding op (the lane's start for its first)
    start     max(reached, each dependency's end, its group's last arrival: the greatest
              `reached` of its members)
    end       start + dur
    step      the greatest lane end (each lane's last holding op, else its start)
Max and one addition per op: the same numbers, bit for bit, as the event loop.

Rows of the time table E: nodes [0, N), lane starts [N, N+L), group arrivals [N+L, N+L+G).
`levels` orders them so every row's inputs sit in an earlier level (longest-path layering, built
by a vectorised Kahn sweep); a graph whose ops wait on each other in a cycle has no such order.

`replay_dense` replays C duration columns at once. `replay_one_kept` replays "only the ops of label
value v as recorded, the rest typical" for many v (blame's by-worker and by-dp-rank what-ifs): a
row can differ from the all-typical replay only where an input or its own duration does, so each
column block computes only those rows (a row equal to the typical one in every column is dropped
again); at 1,024 ranks most of a step is untouched by any one rank.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class Cycle(ValueError):
    """Rows that never become ready: the graph waits on itself."""


@dataclass
class NodeTable:
    """One step's ops as columns (index = node)."""
    lane: np.ndarray            # int: index into lanes
    lanes: list                 # lane keys
    dur: np.ndarray             # float64 s
    optype: np.ndarray          # int: index into optypes
    optypes: list
    kind: np.ndarray            # int: index into kinds
    kinds: list
    rank: np.ndarray
    dp: np.ndarray
    stage: np.ndarray
    marker: np.ndarray          # bool
    measured: np.ndarray        # bool
    holds: np.ndarray           # bool
    eager: np.ndarray           # bool
    group: np.ndarray           # int: index into groups, -1 none
    groups: list                # group keys
    dep_ptr: np.ndarray         # CSR of dependencies: node i waits for dep_idx[dep_ptr[i]:dep_ptr[i+1]]
    dep_idx: np.ndarray
    ids: object                 # list of node ids, or a function -> that list (built on demand)

    def __len__(self):
        return len(self.dur)

    def node_ids(self) -> list:
        if callable(self.ids):
            self.ids = self.ids()
        return self.ids

    def shape_key(self) -> bytes:
        """Equal for two steps that replay alike (ops, lanes, dependencies, groups)."""
        parts = [self.lane, self.optype, self.rank, self.marker, self.holds, self.group,
                 self.dep_ptr, self.dep_idx]
        return b"|".join(np.ascontiguousarray(p).tobytes() for p in parts) + \
            repr((self.lanes, self.optypes, len(self.groups))).encode()


@dataclass
class Level:
    nodes: np.ndarray           # node rows of this level
    lane_prev: np.ndarray       # their reached row
    dep_slots: list             # [(positions in nodes, dependency rows)], one per k-th dependency
    grp_pos: np.ndarray         # positions in nodes that are group members
    grp_row: np.ndarray         # their group's arrival row
    groups: np.ndarray          # group rows computed at this level
    member_prev: np.ndarray     # their members' reached rows, group by group
    member_off: np.ndarray      # where each group's members start in member_prev


class ReplayPlan:
    """The level order of one graph shape, built once and replayed with any durations."""

    def __init__(self, t: NodeTable):
        n, n_lanes, n_groups = len(t), len(t.lanes), len(t.groups)
        self.n, self.n_lanes, self.rows = n, n_lanes, n + n_lanes + n_groups
        lane_prev = np.empty(n, np.int64)
        lane_last = np.arange(n, n + n_lanes)          # a lane's last holding row so far
        holds = t.holds
        # program order: each node's reached row is its lane's previous holding op
        order = np.argsort(t.lane, kind="stable")
        lanes_sorted = t.lane[order]
        prev_hold = _previous_true(holds[order], lanes_sorted)
        first = prev_hold < 0
        lane_prev[order] = np.where(first, n + lanes_sorted, order[np.maximum(prev_hold, 0)])
        last_pos = _previous_true(holds[order], lanes_sorted, inclusive=True)
        is_lane_end = np.r_[lanes_sorted[1:] != lanes_sorted[:-1], True]
        ends = last_pos[is_lane_end]
        lane_last[lanes_sorted[is_lane_end]] = np.where(ends < 0, n + lanes_sorted[is_lane_end],
                                                        order[np.maximum(ends, 0)])
        self.lane_prev, self.lane_last = lane_prev, lane_last
        grow = np.where(t.group >= 0, n + n_lanes + t.group, -1)
        self.grow = grow
        members = np.flatnonzero(t.group >= 0)
        members = members[np.argsort(t.group[members], kind="stable")]
        self.members = members
        # edges: reached -> node, dependency -> node, group -> member, member's reached -> group
        deg = np.diff(t.dep_ptr)
        dst = np.concatenate([np.arange(n), np.repeat(np.arange(n), deg), members,
                              grow[members]])
        src = np.concatenate([lane_prev, t.dep_idx, grow[members], lane_prev[members]])
        self.levels = self._layer(src, dst, t)

    def _layer(self, src, dst, t) -> list:
        rows = self.rows
        indeg = np.bincount(dst, minlength=rows)
        by_src = np.argsort(src, kind="stable")
        out_dst = dst[by_src]
        out_ptr = np.r_[0, np.cumsum(np.bincount(src, minlength=rows))]
        frontier = np.flatnonzero(indeg == 0)
        seen, levels = 0, []
        deg = np.diff(t.dep_ptr)
        while len(frontier):
            seen += len(frontier)
            levels.append(self._level(frontier, t, deg))
            lo, hi = out_ptr[frontier], out_ptr[frontier + 1]
            take = _ranges(lo, hi)
            hit = out_dst[take]
            dec = np.bincount(hit, minlength=rows)
            indeg -= dec
            cand = np.unique(hit)
            frontier = cand[indeg[cand] == 0]
        if seen < rows:
            raise Cycle(f"{rows - seen} ops wait on each other in a cycle")
        return levels

    def _level(self, rows, t, deg) -> Level:
        n, n_lanes = self.n, self.n_lanes
        nodes = rows[rows < n]
        slots = []
        d = deg[nodes]
        for k in range(int(d.max()) if len(nodes) else 0):
            pos = np.flatnonzero(d > k)
            slots.append((pos, t.dep_idx[t.dep_ptr[nodes[pos]] + k]))
        gpos = np.flatnonzero(self.grow[nodes] >= 0)
        groups = rows[rows >= n + n_lanes]
        g = groups - n - n_lanes
        counts = np.bincount(t.group[self.members], minlength=len(t.groups))
        starts = np.r_[0, np.cumsum(counts)]
        take = _ranges(starts[g], starts[g + 1])
        return Level(nodes, self.lane_prev[nodes], slots, gpos, self.grow[nodes[gpos]], groups,
                     self.lane_prev[self.members[take]], np.r_[0, np.cumsum(counts[g])[:-1]])


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The concatenation of arange(lo[i], hi[i])."""
    size = hi - lo
    total = int(size.sum())
    if not total:
        return np.zeros(0, np.int64)
    keep = size > 0
    lo, size = lo[keep], size[keep]
    step = np.ones(total, np.int64)
    at = np.r_[0, np.cumsum(size)[:-1]]
    step[at[0]] = lo[0]
    step[at[1:]] = lo[1:] - (lo[:-1] + size[:-1] - 1)
    return np.cumsum(step)


def _previous_true(flag: np.ndarray, seg: np.ndarray, inclusive: bool = False) -> np.ndarray:
    """Per position, the last earlier (or this, inclusive) position in its segment where flag is
    true; -1 where none."""
    idx = np.where(flag, np.arange(len(flag)), -1)
    if not inclusive:
        idx = np.r_[-1, idx[:-1]]
    seg_start = np.r_[True, seg[1:] != seg[:-1]]
    best = np.maximum.accumulate(idx)
    start_pos = np.maximum.accumulate(np.where(seg_start, np.arange(len(flag)), 0))
    return np.where(best >= start_pos, best, -1)


def replay_dense(plan: ReplayPlan, durs: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """(N, C) durations -> the (C,) step times and the (rows, C) end table."""
    c = durs.shape[1]
    e = np.empty((plan.rows, c))
    e[plan.n:plan.n + plan.n_lanes] = starts[:, None]
    for lv in plan.levels:
        if len(lv.groups):
            e[lv.groups] = np.maximum.reduceat(e[lv.member_prev], lv.member_off, axis=0)
        if len(lv.nodes):
            s = e[lv.lane_prev]
            for pos, dep in lv.dep_slots:
                s[pos] = np.maximum(s[pos], e[dep])
            if len(lv.grp_pos):
                s[lv.grp_pos] = np.maximum(s[lv.grp_pos], e[lv.grp_row])
            s += durs[lv.nodes]
            e[lv.nodes] = s
    return e[plan.lane_last].max(axis=0), e


def replay_one_kept(plan: ReplayPlan, e0: np.ndarray, ide: np.ndarray, rec: np.ndarray,
                    label: np.ndarray, values, block: int = 8) -> np.ndarray:
    """Step times (len(values), S): column (v, s) replays step s with the ops whose label is v at
    rec[:, s], every other op at ide. e0: the all-ide replay's end table (one column)."""
    values = list(values)
    ns = rec.shape[1]
    out = np.empty((len(values), ns))
    where = {v: i for i, v in enumerate(values)}
    pos_all = np.array([where.get(x, -1) for x in label.tolist()]) if len(values) else \
        np.full(len(label), -1)
    rows = _Rows(plan.rows)
    for lo in range(0, len(values), block):
        hi = min(lo + block, len(values))
        vpos = np.where((pos_all >= lo) & (pos_all < hi), pos_all - lo, -1)
        out[lo:hi] = _kept_block(plan, e0, ide, rec, vpos, hi - lo, rows).reshape(hi - lo, ns)
    return out


class _Rows:
    """The rows a column block changed, stored compactly (slot per row), in one buffer reused
    from block to block: memory grows with the rows changed, not with the graph."""

    def __init__(self, rows: int):
        self.slot = np.full(rows, -1, np.int64)
        self.buf = np.empty((0, 0))
        self.used = 0

    def reset(self, c: int):
        self.slot[:] = -1
        self.used = 0
        if self.buf.shape[1] != c:
            self.buf = np.empty((max(64, len(self.buf)), c))

    def get(self, rows):
        return self.buf[self.slot[rows]]

    def put(self, rows, val):
        need = self.used + len(rows)
        if need > len(self.buf):
            grown = np.empty((max(need, 2 * len(self.buf)), self.buf.shape[1]))
            grown[:self.used] = self.buf[:self.used]
            self.buf = grown
        self.buf[self.used:need] = val
        self.slot[rows] = np.arange(self.used, need)
        self.used = need


def _kept_block(plan, e0, ide, rec, vpos, nv, e: _Rows):
    ns = rec.shape[1]
    c = nv * ns
    e.reset(c)
    dirty = e.slot                              # >= 0: the row differs from the typical replay
    cols = np.arange(ns)
    for lv in plan.levels:
        if len(lv.groups):
            md = dirty[lv.member_prev] >= 0
            if md.any():
                clean = np.maximum.reduceat(np.where(md, -np.inf, e0[lv.member_prev]), lv.member_off)
                gi = np.searchsorted(lv.member_off, np.flatnonzero(md), "right") - 1
                runs = np.r_[0, np.flatnonzero(gi[1:] != gi[:-1]) + 1]
                got = np.maximum.reduceat(e.get(lv.member_prev[md]), runs, axis=0)
                gsel = gi[runs]
                np.maximum(got, clean[gsel][:, None], out=got)
                _store(e, e0, lv.groups[gsel], got)
        if not len(lv.nodes):
            continue
        nodes = lv.nodes
        touched = (dirty[lv.lane_prev] >= 0) | (vpos[nodes] >= 0)
        for pos, dep in lv.dep_slots:
            touched[pos] |= dirty[dep] >= 0
        if len(lv.grp_pos):
            touched[lv.grp_pos] |= dirty[lv.grp_row] >= 0
        w = np.flatnonzero(touched)
        if not len(w):
            continue
        k = len(w)
        inputs = [(np.arange(k), lv.lane_prev[w])]
        inv = np.full(len(nodes), -1)
        inv[w] = np.arange(k)
        for pos, dep in lv.dep_slots:
            p = inv[pos]
            inputs.append((p[p >= 0], dep[p >= 0]))
        if len(lv.grp_pos):
            p = inv[lv.grp_pos]
            inputs.append((p[p >= 0], lv.grp_row[p >= 0]))
        base = np.full(k, -np.inf)
        for p, r in inputs:                     # the typical end of each clean input (p unique)
            base[p] = np.maximum(base[p], np.where(dirty[r] >= 0, -np.inf, e0[r]))
        s = np.empty((k, c))
        s[:] = base[:, None]
        for p, r in inputs:                     # the column ends of each dirty input
            d = dirty[r] >= 0
            if d.any():
                s[p[d]] = np.maximum(s[p[d]], e.get(r[d]))
        rows = nodes[w]
        own = np.flatnonzero(vpos[rows] >= 0)
        if len(own):                            # its own duration as recorded in its columns
            rr = np.repeat(own, ns)
            cc = (vpos[rows[own]][:, None] * ns + cols).ravel()
            mine = s[rr, cc] + rec[rows[own]].ravel()
        s += ide[rows][:, None]
        if len(own):
            s[rr, cc] = mine
        _store(e, e0, rows, s)
    last = plan.lane_last
    d = dirty[last] >= 0
    t = np.full(c, e0[last[~d]].max() if (~d).any() else -np.inf)
    if d.any():
        t = np.maximum(t, e.get(last[d]).max(axis=0))
    return t


def _store(e: _Rows, e0, rows, val):
    """Keep the rows that differ from the typical replay in some column."""
    diff = (val != e0[rows][:, None]).any(axis=1)
    if diff.all():
        e.put(rows, val)
    elif diff.any():
        e.put(rows[diff], val[diff])
