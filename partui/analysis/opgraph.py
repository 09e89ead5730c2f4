"""One dependency graph of a recorded step across ranks, replayed on the replay core
(planning/replay.py): a node per op, lanes in program order, cross-rank dependencies and
collective groups. Builders: the op-level table of a Megatron-style job (the ByteDance straggler
artifact's columns, parquet or csv: `read_op_table`, `bytedance_graphs`) and partui's own traces
(partui.analysis.partui_graph).

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

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from partui.analysis.events import TraceError
from partui.analysis.op_table import OP_COLUMNS
from planning.replay import Dep, Op, Stuck, later, run

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


@dataclass
class StepGraph:
    step: int
    nodes: list = field(default_factory=list)
    starts: dict = field(default_factory=dict)      # lane -> start time (default 0)
    recorded: float | None = None                   # the step's recorded time, s
    typical: str = "paper"                          # how blame takes typical durations
    # node id -> (rank, t0 µs, t1 µs, op_id): where a partui trace recorded it (blame_marks)
    spans: dict = field(default_factory=dict)

    ops: list | None = None                         # the replay ops, built once

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


def _transfer(df: pd.DataFrame, key: pd.Series) -> np.ndarray:
    """Per op: recorded end less its group's last recorded start (0 if negative); a non-collective
    keeps its duration."""
    end = (df["start_ts"] + df["duration"]).to_numpy(float)
    last = df.groupby(key)["start_ts"].transform("max").to_numpy(float)
    out = np.maximum(end - last, 0.0)
    return np.where(key.isna().to_numpy(), df["duration"].to_numpy(float), out)


def _group_keys(df: pd.DataFrame) -> pd.Series:
    """Per op: the collective it is a member of, as text (None: not a collective)."""
    t = df["optype"]
    s, st, dp, k = (df[c].astype("int64").astype(str) for c in ("step", "stage", "dp_rank", "k"))
    direction = t.str.split("-").str[0]
    delta = t.map({"forward-recv": -1, "backward-recv": 1}).fillna(0).astype("int64")
    send_stage = (df["stage"].astype("int64") + delta).astype(str)
    key = pd.Series(None, index=df.index, dtype=object)
    p2p = t.isin(list(P2P))
    key[p2p] = ("p2p|" + s + "|" + direction + "|" + send_stage + "|" + dp + "|" + k)[p2p]
    dps = t.isin(DP_SYNCED)
    key[dps] = (t + "|" + s + "|" + st + "|" + k)[dps]
    emb = t.eq("embedding-grads-all-reduce")
    key[emb] = (t + "|" + s + "|" + dp + "|" + k)[emb]
    clip = t.eq("optimizer-clip-main-grad")
    key[clip] = (t + "|" + s + "|" + k)[clip]
    return key


def bytedance_graphs(df: pd.DataFrame) -> list[StepGraph]:
    """The step graphs of an op-level trace (read_op_table), one per step, in step order."""
    df = df[list(OP_COLUMNS)].copy()
    df["optype"] = df["optype"].astype(str).astype(object)
    df = df[df["optype"] != "first-op"]
    df = df.sort_values(["step", "rank", "start_ts", "seq_id"], kind="stable").reset_index(drop=True)
    df["k"] = df.groupby(["step", "rank", "optype"]).cumcount()
    key = _group_keys(df)
    df["transfer"] = _transfer(df, key)
    sizes = key.map(key.value_counts())
    # a step's graph names its groups without the step, so same-shaped steps batch (blame)
    parts = key.str.split("|", n=2)
    df["group"] = (parts.str[0] + "|" + parts.str[2]).where(sizes >= 2, None)
    df["end"] = df["start_ts"] + df["duration"]
    rows = list(df[["rank", "dp_rank", "stage", "optype", "k", "start_ts", "end", "transfer",
                    "group"]].itertuples(index=False, name="OpRow"))
    steps = df["step"].to_numpy()
    ranks = df["rank"].to_numpy()
    cut = np.flatnonzero((steps[1:] != steps[:-1]) | (ranks[1:] != ranks[:-1])) + 1
    graphs: dict = {}
    for lo, hi in zip(np.r_[0, cut], np.r_[cut, len(df)]):
        s = int(steps[lo])
        g = graphs.get(s)
        if g is None:
            g = graphs[s] = StepGraph(s)
        _rank_nodes(g.nodes, rows[lo:hi])
    rec = df.groupby("step").agg(a=("start_ts", "min"), b=("end", "max"))
    for s, g in graphs.items():
        g.recorded = float(rec.loc[s, "b"] - rec.loc[s, "a"])
    return [graphs[s] for s in sorted(graphs)]


def _rank_nodes(out: list, rows: list) -> None:
    r, d, st = int(rows[0].rank), int(rows[0].dp_rank), int(rows[0].stage)
    ident = {id(x): (r, x.optype, int(x.k)) for x in rows}
    comp = [x for x in rows if x.optype in ("forward-compute", "backward-compute")]
    by = {}
    for x in rows:
        by.setdefault(x.optype, []).append(x)
    after: dict = {}

    def need(x, y):
        if x is not None and y is not None:
            after.setdefault(id(x), []).append(ident[id(y)])

    def nth(t, i):
        seq = by.get(t, [])
        return seq[i] if 0 <= i < len(seq) else None

    for t in P2P:
        direction, kind = t.split("-")
        for x in by.get(t, []):
            if kind == "send":
                need(x, nth(f"{direction}-compute", x.k))
            else:
                need(nth(f"{direction}-compute", x.k), x)
                need(x, nth(f"{direction}-compute", x.k - 1))
    first_b = next((i for i, x in enumerate(comp) if x.optype == "backward-compute"), None)
    if first_b is not None and first_b >= 2:
        for t in ("backward-send", "backward-recv"):
            need(nth(t, 0), comp[first_b - 2])
    need(nth("forward-compute", 0), nth("params-all-gather", 0))
    post = sorted((x for x in rows if x.optype in TAIL), key=lambda x: (TAIL.index(x.optype), x.k))
    tail = [x for x in post if x.optype != "params-all-gather"]
    if comp and tail:                        # gc (the tail's first op) after the last compute
        need(tail[0], max(comp, key=lambda x: x.end))
    lanes = {"compute": comp, **{t: by.get(t, []) for t in P2P}, "post": post}
    other = [x for x in rows if x.optype not in TAIL and x.optype not in P2P
             and x.optype not in ("forward-compute", "backward-compute")]
    if other:
        raise TraceError(f"rank {r}: op type(s) {sorted({x.optype for x in other})} not in the "
                         f"dependency model (known: compute, {', '.join(P2P)}, {', '.join(TAIL)})")
    for name, seq in lanes.items():
        lane = (r, name)
        for x in seq:
            nid = ident[id(x)]
            deps = tuple(after.get(id(x), ()))
            if x.group is not None:              # arrive (deps met), then the collective
                out.append(Node(("arrive",) + nid, lane, 0.0, "arrive", r, d, st, deps, marker=True))
                out.append(Node(nid, lane, float(x.transfer), x.optype, r, d, st, (), x.group,
                                kind=KIND_OF.get(x.optype, x.optype)))
            else:
                out.append(Node(nid, lane, float(x.transfer), x.optype, r, d, st, deps,
                                kind=KIND_OF.get(x.optype, x.optype)))
