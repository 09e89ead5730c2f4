"""Who made a step slow, and by how much: the cross-rank critical path of a recorded step and the
what-if attribution of its slowdown, by replaying the step graphs (partui.analysis.replay.opgraph) on the
replay core, every what-if of a step in one batched pass (a duration column each).

The method is the ByteDance straggler paper's ("Understanding Stragglers in Large Model Training
Using What-if Analysis"); partui.analysis.figures.definitions says each figure (FIGURES below).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from partui.analysis.replay.bytedance_graph import COMM_TYPES
from partui.analysis.table.events import TraceError
from partui.analysis.replay.graph_replay import Cycle, ReplayPlan, replay_dense, replay_one_kept
from partui.analysis.replay.opgraph import StepGraph, step_time

# what `partui blame` defines beneath its tables (the words: partui.analysis.figures.definitions)
FIGURES = ("recorded_s", "replayed_s", "ideal_s", "slowdown", "by dp rank", "by stage", "by op type",
           "by worker", "worst worker", "steps", "M_S", "M_W", "critical path", "time_s", "share_pct")


def typical_durations(graphs: list[StepGraph]) -> dict:
    """optype -> its typical duration. "paper" (op-level traces): over every rank and step, the
    mean for compute, the median for comm. "fastest" (partui traces, a type per program place
    and stage): compute at the fastest rank's medians over steps, the fastest: the rank of the
    stage whose medians sum least (with two dp ranks a median cannot leave a straggler out; the
    least median per place, rank by rank, would build a step faster than any rank ran), comm at
    the median of its measured transfers (all of them where none is measured)."""
    if not graphs or graphs[0].typical != "fastest":
        return _typical_paper(graphs)
    per: dict = {}
    measured: dict = {}
    for g in graphs:
        for n in g.nodes:
            if not n.marker:
                per.setdefault(n.optype, {}).setdefault(n.rank, []).append(n.dur)
                if n.measured:
                    measured.setdefault(n.optype, []).append(n.dur)
    med = {t: {r: float(np.median(x)) for r, x in v.items()} for t, v in per.items()}
    total: dict = {}                                   # ("busy", stage) -> {rank: sum of medians}
    for t, v in med.items():
        if t[0] != "comm":
            for r, m in v.items():
                total.setdefault(t[:2], {}).setdefault(r, 0.0)
                total[t[:2]][r] += m
    fastest = {st: min(v, key=lambda r: (v[r], r)) for st, v in total.items()}
    return {t: float(np.median(measured.get(t) or sum(per[t].values(), []))) if t[0] == "comm"
            else v.get(fastest[t[:2]], min(v.values())) for t, v in med.items()}


def _typical_paper(graphs: list[StepGraph]) -> dict:
    """typical_durations' "paper" rule over the graphs' tables: the values of a type taken rank
    by rank (first seen first), each rank's in step and node order, as a list of nodes would."""
    names: list = []
    code_of: dict = {}
    dur, opt, rank = [], [], []
    for g in graphs:
        t = g.table
        remap = np.array([code_of.setdefault(x, len(code_of)) for x in t.optypes] or [0])
        keep = ~t.marker
        dur.append(t.dur[keep])
        opt.append(remap[t.optype[keep]])
        rank.append(t.rank[keep])
    names = list(code_of)
    if not dur:
        return {}
    dur, opt, rank = np.concatenate(dur), np.concatenate(opt), np.concatenate(rank)
    pair, _ = pd.factorize(opt * (int(rank.max()) + 1 if len(rank) else 1) + rank)
    order = np.lexsort((pair, opt))
    dur, opt = dur[order], opt[order]
    cut = np.r_[0, np.flatnonzero(opt[1:] != opt[:-1]) + 1, len(opt)]
    out = {}
    for lo, hi in zip(cut[:-1], cut[1:]):
        t = names[int(opt[lo])]
        out[t] = float(np.median(dur[lo:hi]) if t in COMM_TYPES else np.mean(dur[lo:hi]))
    return {t: out[t] for t in _first_seen(graphs) if t in out}


def _first_seen(graphs) -> list:
    seen: dict = {}
    for g in graphs:
        t = g.table
        for c in pd.unique(t.optype[~t.marker]):
            seen.setdefault(t.optypes[int(c)], None)
    return list(seen)


def recorded_per_node(t, typ: dict) -> np.ndarray:
    """as_recorded for every node of a table."""
    cap = np.array([typ.get(x, np.inf) for x in t.optypes] or [np.inf])[t.optype]
    return np.where(t.measured, t.dur, np.minimum(t.dur, np.where(np.isinf(cap), t.dur, cap)))


def typical_per_node(t, typ: dict) -> np.ndarray:
    """Each node's type's typical duration (0 for a type with none: markers)."""
    return np.array([typ.get(x, 0.0) for x in t.optypes] or [0.0])[t.optype]


def as_recorded(n, typ: dict) -> float:
    """A node's duration "as recorded": its own; where the trace only bounds it (a partui comm op
    whose wait began after the last issue), the lesser of that bound and its type's typical: the
    replay as recorded still ends by the wait, and a scenario that keeps it (the rest typical)
    does not take the receiver's own compute after the issue for transfer."""
    return n.dur if n.measured else min(n.dur, typ.get(n.optype, n.dur))


KEPT_FROM = 32        # values of a label from which its columns replay only their changed rows
                      # (fewer: every row changes anyway; measured on AR 16 ranks and SE 64)


def analyse(graphs: list[StepGraph]) -> dict:
    """Every figure of FIGURES: {"summary": frame, "by dp rank" / "by stage" / "by op type" /
    "by worker": frames, "critical path": frame}."""
    typ = typical_durations(graphs)
    t0 = graphs[0].table
    dps = sorted(set(t0.dp.tolist()))
    stages = sorted(set(t0.stage.tolist()))
    kinds = sorted({g.table.kinds[c] for g in graphs
                    for c in np.unique(g.table.kind[~g.table.marker])})
    ranks = sorted(set(t0.rank.tolist()))
    last = max(stages)
    dense = ["recorded", "ideal"] + [("stage", v) for v in stages] + [("kind", k) for k in kinds] \
        + ["M_S"]
    # one column per value, only it recorded: replayed as changed rows where there are many
    kept = {"dp": dps, "rank": ranks}
    for label in ("dp", "rank"):
        if len(kept[label]) < KEPT_FROM:
            dense += [(label, v) for v in kept.pop(label)]

    def columns(g, rec, ide):
        t = g.table
        code = {k: i for i, k in enumerate(t.kinds)}
        durs = np.empty((len(t), len(dense)))
        for j, c in enumerate(dense):
            if c == "recorded":
                durs[:, j] = rec
            elif c == "ideal":
                durs[:, j] = ide
            elif c == "M_S":
                durs[:, j] = np.where(t.stage == last, ide, rec)
            else:
                hit = t.kind == code.get(c[1], -1) if c[0] == "kind" else getattr(t, c[0]) == c[1]
                durs[:, j] = np.where(hit, rec, ide)
        return durs
    steps = median_steps(graphs, typ) if graphs[0].typical == "fastest" else graphs
    times = replay_columns(steps, typ, columns, kept)
    cols = dense + [(k, v) for k, vs in kept.items() for v in vs]
    mean = dict(zip(map(_key, cols), over_steps(graphs)(times, axis=0)))
    ideal = mean["ideal"]

    def split(kind, keys):
        rows = [{kind: k, "slowdown": mean[_key((kind_col[kind], k))] / ideal} for k in keys]
        return pd.DataFrame(rows).sort_values("slowdown", ascending=False, kind="stable",
                                              ignore_index=True)
    kind_col = {"dp_rank": "dp", "stage": "stage", "optype": "kind", "rank": "rank"}
    by_dp, by_stage = split("dp_rank", dps), split("stage", stages)
    by_kind, by_rank = split("optype", kinds), split("rank", ranks)
    known = [g.recorded for g in graphs if g.recorded is not None]
    recorded, replayed = float(np.mean(known)) if known else float("nan"), mean["recorded"]
    m_s = (replayed - mean["M_S"]) / (replayed - ideal) if replayed > ideal else float("nan")
    m_w, top = _m_w(steps, typ, by_dp, by_stage, replayed, ideal)
    summary = [("recorded_s", recorded), ("replayed_s", replayed), ("ideal_s", ideal),
               ("slowdown", replayed / ideal),
               ("top dp rank", int(by_dp["dp_rank"][0])), ("top stage", int(by_stage["stage"][0])),
               ("top op type", by_kind["optype"][0]), ("worst worker", int(by_rank["rank"][0])),
               ("M_S", m_s), ("M_W", m_w), ("M_W ranks", " ".join(map(str, top))),
               ("steps", len(graphs))]
    return {"summary": pd.DataFrame(summary, columns=["figure", "value"]),
            "by dp rank": by_dp, "by stage": by_stage, "by op type": by_kind, "by worker": by_rank,
            "critical path": slowest_path(graphs, times[:, 0] if steps is graphs else
                                          replay_steps(graphs, lambda g: g.table.dur[:, None])[:, 0])}


def median_steps(graphs: list[StepGraph], typ: dict) -> list[StepGraph]:
    """partui traces (definitions: "steps"): per step, a graph of its shape whose ops last their
    medians (as_recorded) over the steps of that shape; steps of one shape share it."""
    shapes: dict = {}
    for g in graphs:
        shapes.setdefault(shape_of(g), []).append(g)
    out = {}
    for key, gs in shapes.items():
        durs = np.median([recorded_per_node(g.table, typ) for g in gs], axis=0)
        t = replace(gs[0].table, dur=durs.astype(float), measured=np.ones(len(durs), bool))
        out[key] = StepGraph(gs[0].step, None, dict(gs[0].starts), gs[0].recorded, gs[0].typical,
                             table=t)
    return [out[shape_of(g)] for g in graphs]


def shape_of(g: StepGraph) -> bytes:
    """What makes two steps' graphs replay alike: ops, lanes, dependencies, groups (worked out
    once per graph)."""
    if g.shape is None:
        g.shape = g.table.shape_key() + repr(sorted(g.starts.items(), key=repr)).encode()
    return g.shape


def over_steps(graphs):
    """How step times are averaged over steps (definitions: "steps")."""
    return np.median if graphs[0].typical == "fastest" else np.mean


def _key(c):
    return c if isinstance(c, str) else f"{c[0]}:{c[1]}"


def _m_w(graphs, typ, by_dp, by_stage, replayed, ideal):
    dp_score = dict(zip(by_dp["dp_rank"], by_dp["slowdown"]))
    st_score = dict(zip(by_stage["stage"], by_stage["slowdown"]))
    t0 = graphs[0].table
    workers = sorted(set(zip(t0.rank.tolist(), t0.dp.tolist(), t0.stage.tolist())))
    n_top = max(1, math.ceil(len(workers) * 3 / 100))
    scored = sorted(workers, key=lambda w: (-min(dp_score[w[1]], st_score[w[2]]), w[0]))
    top = np.array(sorted({w[0] for w in scored[:n_top]}))
    rem = replay_steps(graphs, lambda g: np.where(np.isin(g.table.rank, top),
                                                   typical_per_node(g.table, typ),
                                                   recorded_per_node(g.table, typ))[:, None])[:, 0]
    t_rem = float(over_steps(graphs)(rem))
    m_w = (replayed - t_rem) / (replayed - ideal) if replayed > ideal else float("nan")
    return m_w, top.tolist()


CHUNK_CELLS = 2_000_000            # node x column cells replayed at once (16 MB of float64)


def _plans(graphs: list[StepGraph]) -> dict:
    """shape -> (its ReplayPlan, the indices of the steps of that shape); a shape's plan is built
    once (kept on its first graph) however many passes replay it."""
    shapes: dict = {}
    for i, g in enumerate(graphs):
        try:
            key = shape_of(g)
            if key not in shapes:
                plan = next((x.plan for x in graphs if x.plan is not None and x.shape == key),
                            None) if g.plan is None else g.plan
                g.plan = plan or ReplayPlan(g.table)
                shapes[key] = (g.plan, [])
        except Cycle as e:
            g.replay()                                # names what waits for what
            raise TraceError(f"step {g.step}: the dependency graph cannot be replayed: {e}") from None
        shapes[key][1].append(i)
    return shapes


def replay_steps(graphs: list[StepGraph], columns) -> np.ndarray:
    """(steps, columns) step times: columns(graph) -> (nodes, columns) durations. Steps whose
    graphs have the same shape replay together, a level of ops at a time."""
    out = [None] * len(graphs)
    for plan, idx in _plans(graphs).values():
        got = _dense_steps(plan, graphs[idx[0]].lane_starts(), [columns(graphs[i]) for i in idx])
        for i, t in zip(idx, got):
            out[i] = t
    return np.array(out)


def _dense_steps(plan, starts, durs: list) -> list:
    """Each step's (columns,) times from its (nodes, columns) durations, a few steps a pass."""
    out = []
    per = max(1, CHUNK_CELLS // max(1, plan.n * durs[0].shape[1]))
    for lo in range(0, len(durs), per):
        block = durs[lo:lo + per]
        t, _e = replay_dense(plan, np.hstack(block), starts)
        w = block[0].shape[1]
        out += [t[j * w:(j + 1) * w] for j in range(len(block))]
    return out


def replay_columns(graphs: list[StepGraph], typ: dict, columns, kept: dict) -> np.ndarray:
    """(steps, dense columns + one per kept value) step times: columns(g, rec, ide) the dense
    ones; kept {label: values}: "only the ops of that label value recorded, the rest typical"
    (graph_replay.replay_one_kept: only the rows a column changes are replayed)."""
    n_kept = sum(len(v) for v in kept.values())
    out = None
    for plan, idx in _plans(graphs).values():
        t0 = graphs[idx[0]].table
        starts = graphs[idx[0]].lane_starts()
        ide = typical_per_node(t0, typ)
        recs = [recorded_per_node(graphs[i].table, typ) for i in idx]
        dense = np.array(_dense_steps(plan, starts, [columns(graphs[i], r, ide)
                                                     for i, r in zip(idx, recs)]))
        if out is None:
            out = np.empty((len(graphs), dense.shape[1] + n_kept))
        out[idx, :dense.shape[1]] = dense
        _t, e0 = replay_dense(plan, ide[:, None], starts)
        rec = np.stack(recs, axis=1)
        at = dense.shape[1]
        for label, values in kept.items():
            got = replay_one_kept(plan, e0[:, 0], ide, rec, getattr(t0, label), values)
            out[idx, at:at + len(values)] = got.T
            at += len(values)
    return out


def slowest_path(graphs: list[StepGraph], replayed: np.ndarray) -> pd.DataFrame:
    """The critical path of the step that replays slowest as recorded."""
    g = graphs[int(np.argmax(replayed))]
    got = g.replay()
    out = critical_path(g, got, float(step_time(got)))
    out.attrs["spans"] = [g.spans[i] for i in out.attrs["nodes"] if i in g.spans]
    return out


def critical_path(graph: StepGraph, got, total: float) -> pd.DataFrame:
    """The chain of ops that ends the step last (column 0 of a batched replay), rows merged per
    run of one rank and type (definitions: "critical path")."""
    def end(i):
        e = got.ops[i].end
        return float("-inf") if e is None else float(e[0]) if isinstance(e, np.ndarray) else float(e)

    node = {n.id: n for n in graph.nodes}
    last = max(got.ops, key=end)
    path = got.critical_path(last)
    keep = [i for k, i in enumerate(path) if not node[i].marker
            and not (k + 1 < len(path) and node[i].group is not None
                     and node[path[k + 1]].group == node[i].group)]
    rows, prev = [], 0.0
    for i in keep:
        n, e = node[i], end(i)
        seg = e - prev
        prev = e
        if rows and rows[-1]["rank"] == n.rank and rows[-1]["optype"] == n.kind:
            rows[-1]["ops"] += 1
            rows[-1]["time_s"] += seg
            continue
        rows.append({"rank": n.rank, "dp_rank": n.dp, "stage": n.stage, "optype": n.kind,
                     "ops": 1, "end_s": e, "time_s": seg})
    out = pd.DataFrame(rows)
    if len(out):
        out["share_pct"] = 100 * out["time_s"] / total
    out.attrs["step"] = graph.step
    out.attrs["nodes"] = keep                         # the path's op ids, first to last
    return out


def blame_line(graphs: list[StepGraph]) -> str:
    """One line: the worst worker and what it cost the others."""
    return line_of(analyse(graphs))


TOP_ROWS = (("dp rank", "by dp rank", "dp_rank"), ("stage", "by stage", "stage"),
            ("op type", "by op type", "optype"), ("worst worker", "by worker", "rank"))


def blame_text(graphs: list[StepGraph]) -> str:
    """The app's Trace tab: blame_line, then the blame table's top rows (dp rank, stage, op type,
    worst worker), each with its slowdown and what it adds to the typical step."""
    res = analyse(graphs)
    ideal_ms = float(res["summary"].set_index("figure")["value"]["ideal_s"]) * 1e3
    out = [line_of(res), f"{'top':<13} {'which':<12} {'slowdown':>8} {'+ms':>7}"]
    for label, section, col in TOP_ROWS:
        top, slow = res[section][col].iloc[0], float(res[section]["slowdown"].iloc[0])
        out.append(f"{label:<13} {str(top):<12} {slow:>8.2f} {(slow - 1) * ideal_ms:>+7.1f}")
    out.append("slowdown: the step replayed with only that one as recorded (the rest typical) / "
               f"every op typical ({ideal_ms:.1f} ms); +ms: what it adds to that step")
    return "\n".join(out)


def line_of(res: dict) -> str:
    """blame_line of an analyse result."""
    s = dict(zip(res["summary"]["figure"], res["summary"]["value"]))
    w = res["by worker"].iloc[0]
    ideal_ms = s["ideal_s"] * 1e3
    return (f"blame: rank {int(w['rank'])} is the slowest worker: with only its ops as recorded "
            f"the step replays in {w['slowdown'] * ideal_ms:.1f} ms against {ideal_ms:.1f} ms "
            f"with every op typical (+{(w['slowdown'] - 1) * ideal_ms:.1f} ms on every rank); "
            f"straggler slowdown {s['slowdown']:.2f} (partui blame for the table)")
