"""Who made a step slow, and by how much: the cross-rank critical path of a recorded step and the
what-if attribution of its slowdown, by replaying the step graphs (partui.analysis.opgraph) on the
replay core, every what-if of a step in one batched pass (a duration column each).

The method is the ByteDance straggler paper's ("Understanding Stragglers in Large Model Training
Using What-if Analysis"); partui.analysis.definitions says each figure (FIGURES below).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from partui.analysis.opgraph import COMM_TYPES, StepGraph, step_time

# what `partui blame` defines beneath its tables (the words: partui.analysis.definitions)
FIGURES = ("recorded_s", "replayed_s", "ideal_s", "slowdown", "by dp rank", "by stage", "by op type",
           "by worker", "worst worker", "steps", "M_S", "M_W", "critical path", "time_s", "share_pct")


def typical_durations(graphs: list[StepGraph]) -> dict:
    """optype -> its typical duration. "paper" (op-level traces): over every rank and step, the
    mean for compute, the median for comm. "fastest" (partui traces, a type per program place
    and stage): compute at the fastest rank's medians over steps, the fastest: the rank of the
    stage whose medians sum least (with two dp ranks a median cannot leave a straggler out; the
    least median per place, rank by rank, would build a step faster than any rank ran), comm at
    the median of its measured transfers (all of them where none is measured)."""
    per: dict = {}
    measured: dict = {}
    for g in graphs:
        for n in g.nodes:
            if not n.marker:
                per.setdefault(n.optype, {}).setdefault(n.rank, []).append(n.dur)
                if n.measured:
                    measured.setdefault(n.optype, []).append(n.dur)
    if not graphs or graphs[0].typical != "fastest":
        return {t: float(np.median(sum(v.values(), [])) if t in COMM_TYPES else
                         np.mean(sum(v.values(), []))) for t, v in per.items()}
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


def as_recorded(n, typ: dict) -> float:
    """A node's duration "as recorded": its own; where the trace only bounds it (a partui comm op
    whose wait began after the last issue), the lesser of that bound and its type's typical: the
    replay as recorded still ends by the wait, and a scenario that keeps it (the rest typical)
    does not take the receiver's own compute after the issue for transfer."""
    return n.dur if n.measured else min(n.dur, typ.get(n.optype, n.dur))


def analyse(graphs: list[StepGraph]) -> dict:
    """Every figure of FIGURES: {"summary": frame, "by dp rank" / "by stage" / "by op type" /
    "by worker": frames, "critical path": frame}."""
    typ = typical_durations(graphs)
    nodes0 = graphs[0].nodes
    dps = sorted({n.dp for n in nodes0})
    stages = sorted({n.stage for n in nodes0})
    kinds = sorted({n.kind for g in graphs for n in g.nodes if not n.marker})
    ranks = sorted({n.rank for n in nodes0})
    last = max(stages)
    cols = (["recorded", "ideal"] + [("dp", d) for d in dps] + [("stage", s) for s in stages]
            + [("kind", k) for k in kinds] + [("rank", r) for r in ranks] + ["M_S"])
    def columns(g):
        rec = np.array([as_recorded(n, typ) for n in g.nodes])
        ide = np.array([typ.get(n.optype, 0.0) for n in g.nodes])
        label = {"dp": np.array([n.dp for n in g.nodes]), "stage": np.array([n.stage for n in g.nodes]),
                 "kind": np.array([n.kind for n in g.nodes]),
                 "rank": np.array([n.rank for n in g.nodes])}
        durs = np.empty((len(g.nodes), len(cols)))
        for j, c in enumerate(cols):
            if c == "recorded":
                durs[:, j] = rec
            elif c == "ideal":
                durs[:, j] = ide
            elif c == "M_S":
                durs[:, j] = np.where(label["stage"] == last, ide, rec)
            else:
                durs[:, j] = np.where(label[c[0]] == c[1], rec, ide)
        return durs
    steps = median_steps(graphs, typ) if graphs[0].typical == "fastest" else graphs
    times = replay_steps(steps, columns)              # steps x columns
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
                                          replay_steps(graphs, lambda g: np.array(
                                              [[n.dur] for n in g.nodes]))[:, 0])}


def median_steps(graphs: list[StepGraph], typ: dict) -> list[StepGraph]:
    """partui traces (definitions: "steps"): per step, a graph of its shape whose ops last their
    medians (as_recorded) over the steps of that shape; steps of one shape share it."""
    shapes: dict = {}
    for g in graphs:
        shapes.setdefault(shape_of(g), []).append(g)
    out = {}
    for key, gs in shapes.items():
        durs = np.median([[as_recorded(n, typ) for n in g.nodes] for g in gs], axis=0)
        nodes = [replace(n, dur=float(d), measured=True) for n, d in zip(gs[0].nodes, durs)]
        out[key] = StepGraph(gs[0].step, nodes, dict(gs[0].starts), gs[0].recorded, gs[0].typical)
    return [out[shape_of(g)] for g in graphs]


def shape_of(g: StepGraph) -> tuple:
    """What makes two steps' graphs replay alike: ops, lanes, dependencies, groups."""
    return tuple((n.id, n.lane, n.after, n.group, n.holds, n.eager) for n in g.nodes)


def over_steps(graphs):
    """How step times are averaged over steps (definitions: "steps")."""
    return np.median if graphs[0].typical == "fastest" else np.mean


def _key(c):
    return c if isinstance(c, str) else f"{c[0]}:{c[1]}"


def _m_w(graphs, typ, by_dp, by_stage, replayed, ideal):
    dp_score = dict(zip(by_dp["dp_rank"], by_dp["slowdown"]))
    st_score = dict(zip(by_stage["stage"], by_stage["slowdown"]))
    workers = sorted({(n.rank, n.dp, n.stage) for n in graphs[0].nodes})
    n_top = max(1, math.ceil(len(workers) * 3 / 100))
    scored = sorted(workers, key=lambda w: (-min(dp_score[w[1]], st_score[w[2]]), w[0]))
    top = {w[0] for w in scored[:n_top]}
    rem = replay_steps(graphs, lambda g: np.array(
        [[typ.get(n.optype, 0.0) if n.rank in top else as_recorded(n, typ)] for n in g.nodes]))[:, 0]
    t_rem = float(over_steps(graphs)(rem))
    m_w = (replayed - t_rem) / (replayed - ideal) if replayed > ideal else float("nan")
    return m_w, sorted(top)


def replay_steps(graphs: list[StepGraph], columns) -> np.ndarray:
    """(steps, columns) step times: columns(graph) -> (nodes, columns) durations. Steps whose
    graphs have the same shape (ops, lanes, dependencies, groups) replay in one batched pass."""
    shapes: dict = {}
    for i, g in enumerate(graphs):
        shapes.setdefault(shape_of(g), []).append(i)
    out = [None] * len(graphs)
    for idx in shapes.values():
        durs = [columns(graphs[i]) for i in idx]
        width = durs[0].shape[1]
        t = step_time(graphs[idx[0]].replay(np.hstack(durs)))
        for j, i in enumerate(idx):
            out[i] = t[j * width:(j + 1) * width]
    return np.array(out)


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
