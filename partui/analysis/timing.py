"""A pipeline trace's own timing, measured per step for the simulator (planning.pipeline.simulate.Timing): the
executor's action spans, each rank's pipeline window in a step (its first to last F / B / W action), each
action's compute outside its waits, and what the rank spent besides: posting p2p ops, dispatching actions,
and each edge's transfer time.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from partui.analysis.sweep import clip, sweep, union_lengths
from planning.pipeline.simulate import Timing

CHUNK_ACTION_CATS = ("F", "B", "W", "FB")  # the executor's action spans carry a chunk; layer spans do not
ACTION_COLUMNS = ["rank", "track", "name", "cat", "kind", "ts", "dur", "end", "mb", "chunk", "cpu_us"]


def actions(df: pd.DataFrame) -> pd.DataFrame:
    """The pipeline executor's action spans (F, B / BW, W, FB pairs)."""
    mask = (df["cat"].isin(CHUNK_ACTION_CATS) & df["chunk"].notna() & df["kind"].isin(["compute", "container"]))
    return df.loc[mask.to_numpy(), ACTION_COLUMNS]  # narrow: a million-row take of every column is slow


def pipeline_windows(df: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame | None:
    """[wid, rank, step, w0, w1]: per step window, the rank's first action start to its last
    action end (wid the step window's); None when the trace has no pipeline actions."""
    acts = actions(df)
    if not len(acts):
        return None
    pieces = clip(acts[["rank", "ts", "end"]], windows)
    if not len(pieces):
        return None
    w = pieces.groupby("wid").agg(w0=("ts", "min"), w1=("end", "max"))
    out = windows.set_index("wid").loc[w.index, ["rank", "step"]].join(w).reset_index()
    return out.sort_values(["rank", "w0"])[["wid", "rank", "step", "w0", "w1"]].reset_index(drop=True)


def _inside(df: pd.DataFrame, acts: pd.DataFrame, mask) -> pd.DataFrame:
    """The spans of df[mask] each given the action (aid) of its rank that began last at or before it,
    cut to that action (actions of a rank never overlap: an as-of join, not a sweep)."""
    spans = df.loc[mask, ["rank", "ts", "end"]].sort_values("ts", kind="stable")
    j = pd.merge_asof(spans, acts.sort_values("ts", kind="stable")[["rank", "ts", "end", "aid"]]
                      .rename(columns={"end": "a_end"}), on="ts", by="rank").dropna(subset=["aid"])
    j["end"] = np.minimum(j["end"], j["a_end"])
    return j[j["end"] > j["ts"]]


def action_compute(df: pd.DataFrame) -> pd.DataFrame:
    """The actions (a row each, aid its position) with `waited` (waits and posts inside them) and
    `compute`: the compute spans inside them (an F / B / W is itself one; an FB pair is a container)
    merged, outside those waits, in us."""
    acts = actions(df)
    acts = acts.assign(aid=np.arange(len(acts)))[["rank", "ts", "end", "dur", "cat", "name", "mb",
                                                   "chunk", "kind", "aid"]]
    acts = acts.assign(compute=0.0, waited=0.0)
    if not len(acts):
        return acts
    kind = df["kind"].to_numpy()
    waits = _inside(df, acts, kind == "wait")
    comp = _inside(df, acts, (kind == "compute") & ~df.index.isin(acts.index))
    own = acts[acts["kind"] == "compute"]
    key = np.concatenate([own["aid"], comp["aid"], waits["aid"]]).astype(np.int64)
    ts = np.concatenate([own["ts"], comp["ts"], waits["ts"]])
    end = np.concatenate([own["end"], comp["end"], waits["end"]])
    cls = np.concatenate([np.zeros(len(own) + len(comp), dtype=np.int64), np.full(len(waits), 2)])
    keys, lengths, _, _ = sweep(key, ts, end, cls, 3)
    acts.loc[acts.index[keys], "compute"] = lengths[:, 0]
    acts.loc[acts.index[keys], "waited"] = lengths[:, 2]
    return acts


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


def first_word(labels: pd.Series) -> np.ndarray:
    """Each label's first word ("BW mb3 c0" -> "BW"), split once per distinct label."""
    cat = pd.Categorical(labels)
    words = np.array([str(c).split()[0] if str(c).split() else "" for c in cat.categories] + [""],
                     dtype=object)
    return words[cat.codes]  # code -1 (no label) takes the trailing ""


def step_timings(df: pd.DataFrame, windows: pd.DataFrame, acts: pd.DataFrame | None = None) -> dict:
    """{step: Timing} in us, each step's own: per action (rank, kind, chunk, microbatch) its compute; per
    post (rank, SEND | RECV, n) its time, with each rank's mean as the fallback; per rank dispatch, its pipeline window covered by no span
    on its compute track plus an FB pair's own time outside its compute and waits, shared over its
    actions; per transfer (src, dst, n) its time where measured (args.transfer_us: the send's post to
    the recv's completion, where the receiver was already waiting), else the edge's mean in the
    step, over all steps, all edges' mean, or none (the simulator's Cost.p2p, 0)."""
    acts = _step_of(action_compute(df) if acts is None else acts, windows)
    acts = acts.assign(what=first_word(acts["name"]))
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
    pipe = pipeline_windows(df, windows)
    gaps = pd.Series(dtype=float)
    if pipe is not None:
        on_track = (df["track"] == "compute").to_numpy() & df["kind"].isin(["compute", "container",
                                                                              "wait"]).to_numpy()
        pieces = clip(df.loc[on_track, ["rank", "ts", "end"]], pipe)  # narrow: clip copies rows
        keys, lengths = union_lengths(pieces["wid"].to_numpy(), pieces["ts"].to_numpy(),
                                      pieces["end"].to_numpy(), pieces["rank"].to_numpy())
        covered = pd.Series(lengths, index=keys).reindex(pipe["wid"].to_numpy(), fill_value=0.0)
        gaps = pd.Series((pipe["w1"] - pipe["w0"]).to_numpy() - covered.to_numpy(),
                         index=pipe["wid"].to_numpy())
    acts = acts.assign(inner=(acts["dur"] - acts["waited"] - acts["compute"]).clip(lower=0))
    out = {}
    for step, mine in acts.groupby("step"):
        compute = mine.groupby(["rank", "what", "chunk", "mb"])["compute"].mean()  # one action each
        by_rank = mine.groupby("rank").agg(n=("aid", "size"), inner=("inner", "sum"), wid=("wid", "first"))
        dispatch = {int(r): float((gaps.get(row.wid, 0.0) + row.inner) / row.n) for r, row in by_rank.iterrows()}
        mine_posts = posts[posts["step"] == step]
        p = mine_posts.groupby(["rank", "op"], observed=True)["dur"].mean()
        post = {(int(r), str(op).upper()): float(v) for (r, op), v in p.items()}
        post.update({(int(r), str(op).upper(), int(n)): float(d) for r, op, n, d in
                     zip(mine_posts["rank"], mine_posts["op"], mine_posts["n"], mine_posts["dur"])})
        mine_recvs = recvs[recvs["step"] == step]
        t = mine_recvs.groupby(["peer", "rank"])["transfer_us"].mean()
        latency = {}
        if np.isfinite(everywhere):
            for a in ranks:
                for b in ranks:
                    if a != b:
                        latency[(a, b)] = float(t.get((a, b), overall.get((a, b), everywhere)))
            latency.update({(int(a), int(b), int(n)): float(v) for a, b, n, v in
                            zip(mine_recvs["peer"], mine_recvs["rank"], mine_recvs["n"], mine_recvs["transfer_us"])})
        out[step] = Timing(compute={(int(r), str(k), int(c), int(m)): float(v)
                                    for (r, k, c, m), v in compute.items()},
                           dispatch=dispatch, post=post, latency=latency)
    return out
