"""A pipeline trace's own timing, measured per step for the simulator (planning.pipeline.simulate.Timing): the
executor's action spans, each rank's pipeline window in a step (its first to last F / B / W action), each
action's compute outside its waits, and what the rank spent besides: posting p2p ops, dispatching actions,
and each edge's transfer time.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.table.sweep import clip, clip_index, sweep, union_lengths
from planning.pipeline.simulate import Timing

CHUNK_ACTION_CATS = ("F", "B", "W", "FB")  # the executor's action spans carry a chunk; layer spans do not
ACTION_COLUMNS = ["rank", "track", "name", "cat", "kind", "ts", "dur", "end", "mb", "chunk", "cpu_us"]


def actions(df: pd.DataFrame) -> pd.DataFrame:
    """The pipeline executor's action spans (F, B / BW, W, FB pairs)."""
    mask = (df["cat"].isin(CHUNK_ACTION_CATS) & df["chunk"].notna() & df["kind"].isin(["compute", "container"]))
    return df.loc[mask.to_numpy(), ACTION_COLUMNS]  # narrow: a million-row take of every column is slow


def pipeline_windows(df: pd.DataFrame, windows: pd.DataFrame, acts: pd.DataFrame | None = None) -> pd.DataFrame | None:
    """[wid, rank, step, w0, w1]: per step window, the rank's first action start to its last
    action end (wid the step window's); None when the trace has no pipeline actions. `acts`:
    actions(df) (or any frame of their rows with rank, ts, end), when the caller has it."""
    acts = actions(df) if acts is None else acts
    if not len(acts):
        return None
    _, wid, ts, end = clip_index(acts["rank"].to_numpy(), acts["ts"].to_numpy(), acts["end"].to_numpy(), windows)
    if not len(wid):
        return None
    # per window: the least start and the greatest end of its pieces, one sort, no groupby
    order = np.argsort(wid, kind="stable")
    wid, ts, end = wid[order], ts[order], end[order]
    first = np.flatnonzero(np.r_[True, wid[1:] != wid[:-1]])
    got = wid[first]
    at = windows.set_index("wid").loc[got, ["rank", "step"]]
    out = pd.DataFrame({"wid": got, "rank": at["rank"].to_numpy(), "step": at["step"].to_numpy(),
                        "w0": np.minimum.reduceat(ts, first), "w1": np.maximum.reduceat(end, first)})
    return out.sort_values(["rank", "w0"])[["wid", "rank", "step", "w0", "w1"]].reset_index(drop=True)


def _inside(df: pd.DataFrame, acts: pd.DataFrame, mask) -> pd.DataFrame:
    """The spans of df[mask] each given the action (aid) of its rank that began last at or before it,
    cut to that action (actions of a rank never overlap: an as-of join, not a sweep)."""
    spans = df.loc[mask, ["rank", "ts", "end"]].sort_values("ts", kind="stable")
    j = pd.merge_asof(spans, acts.sort_values("ts", kind="stable")[["rank", "ts", "end", "aid"]]
                      .rename(columns={"end": "a_end"}), on="ts", by="rank").dropna(subset=["aid"])
    j["end"] = np.minimum(j["end"], j["a_end"])
    return j[j["end"] > j["ts"]]


def action_compute(df: pd.DataFrame, acts: pd.DataFrame | None = None) -> pd.DataFrame:
    """The actions (a row each, aid its position) with `waited` (waits and posts inside them) and
    `compute`: the compute spans inside them (an F / B / W is itself one; an FB pair is a container)
    merged, outside those waits, in us. `acts`: actions(df), when the caller has it. Only actions
    with a span inside them are swept; an action alone is its own length (a sweep of one interval)."""
    acts = actions(df) if acts is None else acts
    acts = acts[["rank", "ts", "end", "dur", "cat", "name", "mb", "chunk", "kind"]]
    n = len(acts)
    own = (acts["kind"] == "compute").to_numpy()
    start, stop = acts["ts"].to_numpy(), acts["end"].to_numpy()
    compute = np.where(own, np.maximum(stop - start, 0.0), 0.0) if n else np.zeros(0)
    waited = np.zeros(n)
    if n:
        frame = acts[["rank", "ts", "end"]].assign(aid=np.arange(n))
        kind = df["kind"]
        waits = _inside(df, frame, (kind == "wait").to_numpy())
        is_act = np.zeros(len(df), dtype=bool)
        at = df.index.get_indexer(acts.index)
        is_act[at[at >= 0]] = True
        comp = _inside(df, frame, (kind == "compute").to_numpy() & ~is_act)
        inner = np.concatenate([comp["aid"].to_numpy(), waits["aid"].to_numpy()]).astype(np.int64)
        company = np.zeros(n, dtype=bool)
        company[inner] = True
        mine = np.flatnonzero(own & company)  # own spans with something inside them
        if len(inner):
            key = np.concatenate([mine, inner])
            ts = np.concatenate([start[mine], comp["ts"].to_numpy(), waits["ts"].to_numpy()])
            end = np.concatenate([stop[mine], comp["end"].to_numpy(), waits["end"].to_numpy()])
            cls = np.concatenate([np.zeros(len(mine) + len(comp), dtype=np.int64), np.full(len(waits), 2)])
            keys, lengths, _, _ = sweep(key, ts, end, cls, 3)
            compute[keys] = lengths[:, 0]
            waited[keys] = lengths[:, 2]
    return acts.assign(aid=np.arange(n), compute=compute, waited=waited)


def action_costs(df: pd.DataFrame, acts: pd.DataFrame | None = None) -> dict:
    """Mean compute (us) of each action kind over all ranks and steps (the ideal simulation's uniform
    Cost): an action's compute outside its waits, so a recv waited inside an F is not F's cost.
    `acts`: action_compute(df), when the caller has it."""
    acts = action_compute(df) if acts is None else acts
    return acts.groupby(acts["cat"].astype(str))["compute"].mean().to_dict() if len(acts) else {}


def _step_of(x: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """x's rows inside step windows, with their window's wid and step (-1 without step spans)."""
    pieces = clip(x, windows)
    return pieces.assign(step=windows["step"].fillna(-1).to_numpy()[pieces["wid"].to_numpy()])


def first_word(labels: pd.Series) -> pd.Categorical:
    """Each label's first word ("BW mb3 c0" -> "BW"; no label: ""), split once per distinct label
    and kept as codes: a million actions share a handful of words."""
    cat = pd.Categorical(labels)
    words = [str(c).split()[0] if str(c).split() else "" for c in cat.categories] + [""]
    uniq = sorted(set(words))  # in order, as a groupby over the words themselves would list them
    code = np.array([uniq.index(w) for w in words], dtype=np.int64)
    return pd.Categorical.from_codes(code[cat.codes], uniq)  # code -1 (no label) takes the trailing ""


def step_timings(df: pd.DataFrame, windows: pd.DataFrame, acts: pd.DataFrame | None = None,
                 pipe: pd.DataFrame | None = None) -> dict:
    """{step: Timing} in us, each step's own: per action (rank, kind, chunk, microbatch) its compute; per
    post (rank, SEND | RECV, n) its time, with each rank's mean as the fallback; per rank dispatch, its pipeline window covered by no span
    on its compute track plus an FB pair's own time outside its compute and waits, shared over its
    actions; per transfer (src, dst, n) its time where measured (args.transfer_us: the send's post to
    the recv's completion, where the receiver was already waiting), else the edge's mean in the
    step, over all steps, all edges' mean, or none (the simulator's Cost.p2p, 0). `acts`:
    action_compute(df), `pipe`: pipeline_windows(df, windows), when the caller has them. Each figure
    is one groupby over all steps (step a key), split into steps after: no pass over the table per step."""
    acts = _step_of(action_compute(df) if acts is None else acts, windows)
    acts = acts.assign(what=first_word(acts["name"]),  # codes: a million labels as objects cost a string column
                       inner=(acts["dur"] - acts["waited"] - acts["compute"]).clip(lower=0))
    p2p = df[(df["op"].isin(["send", "recv"]) & (df["group"].isna() | (df["group"] == "pp"))).to_numpy()]
    # the n-th post of a side on a rank in a step is the n-th SEND / RECV of its action list, the n-th
    # recv from a peer the n-th RECV from it (the executor posts in list order)
    posts = _step_of(p2p.loc[p2p["cat"] == "post", ["rank", "ts", "end", "dur", "op"]], windows)
    posts = posts.sort_values(["step", "rank", "ts"], kind="stable")
    posts["n"] = posts.groupby(["step", "rank", "op"], observed=True).cumcount()
    recvs = p2p[(p2p["kind"] == "comm") & (p2p["op"] == "recv")]
    recvs = _step_of(recvs[["rank", "ts", "end", "peer", "transfer_us"]], windows)
    recvs = recvs.sort_values(["step", "rank", "ts"], kind="stable")
    recvs["n"] = recvs.groupby(["step", "peer", "rank"]).cumcount()
    recvs = recvs[recvs["transfer_us"].notna()]
    overall = recvs.groupby(["peer", "rank"])["transfer_us"].mean()
    everywhere = float(recvs["transfer_us"].mean()) if len(recvs) else np.nan
    ranks = sorted(int(r) for r in df["rank"].unique())
    pipe = pipeline_windows(df, windows) if pipe is None else pipe
    gaps = {}
    if pipe is not None:
        on_track = (df["track"] == "compute").to_numpy() & df["kind"].isin(["compute", "container",
                                                                              "wait"]).to_numpy()
        rank = df["rank"].to_numpy()[on_track]
        rows, wid, ts, end = clip_index(rank, df["ts"].to_numpy()[on_track], df["end"].to_numpy()[on_track], pipe)
        keys, lengths = union_lengths(wid, ts, end, rank[rows])
        covered = pd.Series(lengths, index=keys).reindex(pipe["wid"].to_numpy(), fill_value=0.0)
        gaps = dict(zip(pipe["wid"].to_numpy().tolist(), ((pipe["w1"] - pipe["w0"]).to_numpy() - covered.to_numpy())))
    compute = acts.groupby(["step", "rank", "what", "chunk", "mb"], observed=True)["compute"].mean()  # one action each
    by_rank = acts.groupby(["step", "rank"]).agg(n=("aid", "size"), inner=("inner", "sum"), wid=("wid", "first"))
    post_mean = posts.groupby(["step", "rank", "op"], observed=True)["dur"].mean()
    transfer = recvs.groupby(["step", "peer", "rank"])["transfer_us"].mean()
    steps = sorted(float(s) for s in pd.unique(acts["step"].to_numpy()))
    out = {s: {"compute": {}, "dispatch": {}, "post": {}, "latency": {}} for s in steps}
    for (s, r, k, c, m), v in compute.items():
        out[s]["compute"][(int(r), str(k), int(c), int(m))] = float(v)
    for (s, r), n, inner, wid in zip(by_rank.index, by_rank["n"], by_rank["inner"], by_rank["wid"]):
        out[s]["dispatch"][int(r)] = float((gaps.get(wid, 0.0) + inner) / n)
    for (s, r, op), v in post_mean.items():
        if s in out:
            out[s]["post"][(int(r), str(op).upper())] = float(v)
    for s, r, op, n, d in zip(posts["step"], posts["rank"], posts["op"], posts["n"], posts["dur"]):
        if s in out:
            out[s]["post"][(int(r), str(op).upper(), int(n))] = float(d)
    if np.isfinite(everywhere):
        edges = {(a, b): float(overall.get((a, b), everywhere)) for a in ranks for b in ranks if a != b}
        for s in out:
            out[s]["latency"].update(edges)
        for (s, a, b), v in transfer.items():
            if s in out and (int(a), int(b)) in edges:
                out[s]["latency"][(int(a), int(b))] = float(v)
        for s, a, b, n, v in zip(recvs["step"], recvs["peer"], recvs["rank"], recvs["n"], recvs["transfer_us"]):
            if s in out:
                out[s]["latency"][(int(a), int(b), int(n))] = float(v)
    return {s: Timing(**fields) for s, fields in out.items()}

