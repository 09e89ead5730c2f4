"""One dependency graph of a recorded step across ranks, replayed on the replay core
(planning/replay.py): a node per op, lanes in program order, cross-rank dependencies and
collective groups. Builders: the op-level table of a Megatron-style job
(partui.analysis.replay.bytedance_graph) and partui's own traces (partui.analysis.replay.partui_graph), each a
StepGraph: a list of Node, or the same as a NodeTable (partui.analysis.replay.graph_replay: the arrays
blame replays). A collective's members all end at the last member's arrival plus their own
transfer time.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from partui.analysis.table.events import TraceError
from partui.analysis.replay.graph_replay import Cycle, NodeTable
from planning.replay import Dep, Op, Stuck, later, run


@dataclass(slots=True)
class Node:
    """One op of the graph: a replay Op's fields and what blame groups it by."""
    id: tuple
    lane: tuple
    dur: float                          # seconds: recorded (transfer time for a collective)
    optype: str
    rank: int
    dp: int
    stage: int
    after: tuple = ()                   # node ids
    group: tuple | None = None
    holds: bool = True
    eager: bool = True
    marker: bool = False                # an arrival point (takes no time, enters no figure)
    kind: str = ""                      # what "by op type" groups it under (default: optype)
    measured: bool = True               # dur is the op's own, not only a bound on it (partui_graph)


class StepGraph:
    """One step's graph: its nodes as a list of Node (built on demand) or as a NodeTable (the
    arrays blame replays; built on demand from the nodes)."""

    def __init__(self, step: int, nodes: list | None = None, starts: dict | None = None,
                 recorded: float | None = None, typical: str = "paper", spans: dict | None = None,
                 table: NodeTable | None = None):
        self.step = step
        self._nodes = list(nodes) if nodes is not None else None if table is not None else []
        self.starts = starts if starts is not None else {}     # lane -> start time (default 0)
        self.recorded = recorded                    # the step's recorded time, s
        self.typical = typical                      # how blame takes typical durations
        # node id -> (rank, t0 µs, t1 µs, op_id): where a partui trace recorded it (blame_marks)
        self.spans = spans if spans is not None else {}
        self._table = table
        self.ops = None                             # the replay ops, built once
        self.matched_by = "order"                   # partui traces: how ops pair across ranks
        self.shape: bytes | None = None             # blame: what replays alike, and its plan
        self.plan = None

    @property
    def nodes(self) -> list:
        if self._nodes is None:
            self._nodes = nodes_of(self._table)
        return self._nodes

    @property
    def table(self) -> NodeTable:
        if self._table is None:
            self._table = table_of(self._nodes)
        return self._table

    def lane_starts(self) -> np.ndarray:
        return np.array([float(self.starts.get(k, 0.0)) for k in self.table.lanes])

    def replay(self, durs=None):
        """The replay of this step with `durs`: one per node (default: as recorded), or a
        (nodes, columns) array: every column replayed in one pass (times become vectors)."""
        if self.ops is None:
            self.ops = [Op(n.id, n.lane, n.dur, tuple(Dep(a) for a in n.after), n.group, None,
                           n.holds, n.eager) for n in self.nodes]
        batched = durs is not None and np.ndim(durs) == 2
        for op, n, d in zip(self.ops, self.nodes, [n.dur for n in self.nodes] if durs is None else durs):
            op.dur = d if batched else float(d)
        try:
            return run(self.ops, self.starts, elementwise if batched else later)
        except Stuck as e:
            raise TraceError(f"step {self.step}: the dependency graph cannot be replayed: {e}") from None


def _codes(values) -> tuple[np.ndarray, list]:
    """Values -> (int codes, the distinct values in first-seen order)."""
    seen: dict = {}
    codes = np.fromiter((seen.setdefault(v, len(seen)) for v in values), np.int64, len(values))
    return codes, list(seen)


def table_of(nodes: list) -> NodeTable:
    """The NodeTable of a list of Node; a dependency on no node of the list raises Cycle (the
    event loop then names it)."""
    at = {n.id: i for i, n in enumerate(nodes)}
    lane, lanes = _codes([n.lane for n in nodes])
    optype, optypes = _codes([n.optype for n in nodes])
    kind, kinds = _codes([n.kind for n in nodes])
    gcodes, groups = _codes([n.group for n in nodes if n.group is not None])
    group = np.full(len(nodes), -1, np.int64)
    group[[i for i, n in enumerate(nodes) if n.group is not None]] = gcodes
    try:
        deps = [at[a] for n in nodes for a in n.after]
    except KeyError as e:
        raise Cycle(f"a dependency on {e.args[0]!r}, no op of the step") from None
    col = lambda f, t: np.array([f(n) for n in nodes], t)
    return NodeTable(lane, lanes, col(lambda n: n.dur, float), optype, optypes, kind, kinds,
                     col(lambda n: n.rank, np.int64), col(lambda n: n.dp, np.int64),
                     col(lambda n: n.stage, np.int64), col(lambda n: n.marker, bool),
                     col(lambda n: n.measured, bool), col(lambda n: n.holds, bool),
                     col(lambda n: n.eager, bool), group, groups,
                     np.r_[0, np.cumsum([len(n.after) for n in nodes])].astype(np.int64),
                     np.array(deps, np.int64), [n.id for n in nodes])


def nodes_of(t: NodeTable) -> list:
    ids = t.node_ids()
    out = []
    for i in range(len(t)):
        deps = t.dep_idx[t.dep_ptr[i]:t.dep_ptr[i + 1]]
        out.append(Node(ids[i], t.lanes[t.lane[i]], float(t.dur[i]), t.optypes[t.optype[i]],
                        int(t.rank[i]), int(t.dp[i]), int(t.stage[i]), tuple(ids[j] for j in deps),
                        t.groups[t.group[i]] if t.group[i] >= 0 else None, bool(t.holds[i]),
                        bool(t.eager[i]), bool(t.marker[i]), t.kinds[t.kind[i]], bool(t.measured[i])))
    return out


def elementwise(current, candidate) -> tuple:
    """replay's `pick` for vector times: the later per column; won follows column 0."""
    c0 = current[0] if isinstance(current, np.ndarray) else current
    a0 = candidate[0] if isinstance(candidate, np.ndarray) else candidate
    return np.maximum(current, candidate), a0 > c0


def step_time(got):
    """A replay's step time: its last lane's end (every lane of the step starts at 0); a vector
    when the replay was batched."""
    return np.max(np.array([np.broadcast_to(v, np.shape(v)) for v in got.lane_end.values()],
                           dtype=object).tolist(), axis=0)
