"""What-if replay: a recorded trace's per-rank op graph replayed under an emulated link and a
compute scale, on the replay core (planning/replay.py) with the link's own rules (planning.link:
match_key, Ports), the ones the live emulation holds ops to (kernels/comm/emulate.py).

Each rank's step becomes a program: busy stretches (the recorded wall time between its comm
events that was not spent waiting: compute, and the host work around it), comm issues and waits.
Replaying it, busy stretches last their recorded time times `compute_scale`; an issue costs
nothing; a wait blocks until the op's predicted end:
    collective   the last member's issue, plus latency, plus transfer on this rank's port
    send         its own issue (eager), same port rule; recv: the matching send's end or later
Collectives are matched by (group, n-th op on it); members come from the trace's plan
(planning.mesh.partition). p2p by (src, dst, tag, n-th message). The p2p steps inside hand
collectives (args "parent") are part of their outer op and are not replayed on their own.

As the live emulation (kernels/comm/emulate.completion: an op ends at max(the link's end, gloo's
own)), a collective ends no sooner than gloo delivered it in the recording (recorded completion
less the last member's recorded issue) after its replayed start, and a wait lasts its own recorded
time past max(its start, its op's recorded end) after max(reached, the op's end): host work on an
op already done, or the wake-up after one it blocked on (programs). Under --ep 2 --overlap at
alpha_us=50,gbps=0.02 a 64-byte count exchange (51 us on the link) took gloo 0.4-1.2 ms, a
dispatch's ~0.8 ms about the link's, and waits ~4 ms a step past their ops: the link alone
predicted that step 10% short even from the linked trace itself. link_only=True: the link model
alone (a cluster's view). p2p ops keep the link's rule: gloo's p2p has no future, so a trace sees
their completion only when the rank looked. floor=True: a wait also lasts at least its recorded
length (the live emulation cannot hand bytes over before gloo does).

Each rank starts at its recorded offset from the first rank's step start (the controller does not
start them together, and a collective waits for the last member), and its step is its own.

Predicted per rank (partui.analysis.figures.definitions, view "whatif"): step time, blocked_ms (time
blocked in waits: not the report's exposed_comm_ms), comm in flight and its overlap with busy time;
per op (`simulate`'s second table): issue, end, time waited and when the wait returned.

`without_overlap` rewrites the programs so no send or collective is in flight during busy time
(each waited right after its issue): the replay of the same op graph with no overlap, which the
app's Trace tab sets against the replay as recorded ("saved").
"""
from __future__ import annotations

import pandas as pd

from partui.analysis.figures.definitions import defined, definitions_of
from partui.analysis.table.events import TraceError
from planning.intervals import intersect, length, merge
from planning.link import LinkModel, Ports, match_key
from planning.mesh import GROUPS, Plan, partition
from planning.replay import Dep, Op, Stuck, run


def steps_of(doc: dict) -> list[int]:
    """The recorded steps, the first left out as a warm-up when there are more."""
    s = sorted({e["args"].get("step", 0) for e in doc["traceEvents"]
                if e.get("ph") == "X" and e.get("cat") == "step"})
    return s[1:] if len(s) > 1 else s


def programs(doc: dict, step: int | None = None) -> dict:
    """{rank: {"start", "end", "items"}} of one recorded step (default: the last) per rank; items
    are ("busy", ns) | ("issue", op) | ("wait", op_id, recorded µs, own µs) with op the comm
    event's args; a wait's own time is how long it lasted past max(its start, its op's recorded
    end): the call's host work on an op already done, or the wake-up after one it blocked on."""
    ev = doc["traceEvents"]
    done = {(e.get("pid"), e["args"]["op_id"]): e["ts"] + e["dur"] for e in ev
            if e.get("ph") == "X" and e.get("cat") == "comm" and "op_id" in (e.get("args") or {})
            and "parent" not in e["args"]}
    steps = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "step"]
    if not steps:
        raise TraceError("the trace has no step spans: record it with partui run --trace")
    want = step if step is not None else max(e["args"].get("step", 0) for e in steps)
    out = {}
    for s in (e for e in steps if e["args"].get("step", 0) == want):
        r, t0, t1 = s["pid"], s["ts"], s["ts"] + s["dur"]
        marks = []
        for e in ev:
            a = e.get("args") or {}
            # a recv posted before its send: the stitcher starts its slice at the send's post
            # (partui.recording.tracefile.fit_p2p_slices); the rank posted it posted_early_us before
            ts = e.get("ts", 0) - (a.get("posted_early_us") or 0.0)
            if e.get("ph") != "X" or e.get("pid") != r or not t0 - 1e-3 <= ts <= t1:  # 1 ns
                continue
            if e.get("cat") == "comm" and "parent" not in a and "op_id" in a:
                marks.append((ts, 0, ("issue", dict(a, name=e["name"], recorded_issue_us=e["ts"],
                                                    recorded_end_us=e["ts"] + e["dur"]))))
            elif e.get("cat") == "wait" and "op_id" in a:
                end = done.get((r, a["op_id"]), e["ts"] + e["dur"])
                own = max(0.0, e["ts"] + e["dur"] - max(e["ts"], end))
                marks.append((e["ts"], 1, ("wait", a["op_id"], e["dur"], own)))
        items, cursor = [], t0
        for ts, _o, m in sorted(marks, key=lambda x: (x[0], x[1])):
            items.append(("busy", max(0.0, ts - cursor) * 1e3))
            items.append(m if m[0] == "wait" else m[:2])
            cursor = max(cursor, ts + (m[2] if m[0] == "wait" else 0.0))
        items.append(("busy", max(0.0, t1 - cursor) * 1e3))
        out[r] = {"start": t0, "end": t1, "items": items}
    if not out:
        raise TraceError(f"step {want} is not in the trace: pick one of its recorded steps")
    first = min(p["start"] for p in out.values())
    for p in out.values():
        p["offset"] = p["start"] - first             # µs after the first rank began the step
    return out


def on_own_cores(doc: dict, progs: dict, step: int | None = None) -> dict:
    """The programs as one device per rank would run them. On a machine whose cores the ranks
    share, a busy stretch's wall time holds the time its rank was runnable with no core; each rank's
    busy stretches are scaled by its core share in the step, the step span's thread CPU time
    (args.cpu_us) over its busy time (at most 1). A rank whose step recorded no CPU time keeps its
    stretches. Comm threads' CPU is left out: on its own device a rank runs them on other cores,
    and so are gloo's own time for each collective (its recorded end) and each wait's own time
    (programs): the link alone moves bytes, and no wake-up waits for a core."""
    want = step if step is not None else max(
        e["args"].get("step", 0) for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "step")
    cpu = {e["pid"]: e["args"]["cpu_us"] for e in doc["traceEvents"]
           if e.get("ph") == "X" and e.get("cat") == "step" and e["args"].get("step", 0) == want
           and e["args"].get("cpu_us") is not None}
    out = {}
    for r, p in progs.items():
        busy_ns = sum(it[1] for it in p["items"] if it[0] == "busy")
        share = min(1.0, cpu[r] * 1e3 / busy_ns) if r in cpu and busy_ns > 0 else 1.0
        out[r] = dict(p, core_share=share, items=[
            ("busy", it[1] * share) if it[0] == "busy" else
            ("issue", {k: v for k, v in it[1].items() if k != "recorded_end_us"})
            if it[0] == "issue" else it[:3] if it[0] == "wait" else it for it in p["items"]])
    return out


def members(plan: Plan | None, group: str, rank: int, world: int) -> tuple:
    if plan is None or group not in GROUPS:
        return tuple(range(world))
    return tuple(next(g for g in partition(plan, group) if rank in g))


def without_overlap(progs: dict) -> dict:
    """The same programs with every send and collective waited right after its issue: no busy
    stretch runs while one of them is in flight on its rank. A recv keeps its place (its bytes come
    with its send, which the sender now waits for; moving it could deadlock a pipeline's crossed
    exchanges). Later waits on an op already waited are dropped (they return at once); the moved
    wait keeps the first one's own time."""
    out = {}
    for r, p in progs.items():
        items, held = [], set()
        waited = {}
        for it in p["items"]:
            if it[0] == "wait":
                waited.setdefault(it[1], it[3] if len(it) > 3 else 0.0)
        for it in p["items"]:
            if it[0] == "issue":
                items.append(it)
                if it[1]["op"] != "recv" and it[1]["op_id"] in waited:
                    items.append(("wait", it[1]["op_id"], 0.0, waited[it[1]["op_id"]]))
                    held.add(it[1]["op_id"])
            elif it[0] == "wait" and it[1] in held:
                continue
            else:
                items.append(it)
        out[r] = dict(p, items=items)
    return out


def simulate(progs: dict, link: LinkModel, compute_scale: float = 1.0, floor: bool = False,
             plan: Plan | None = None, link_only: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Replay `programs` under `link`: (per-rank figures, per-op timeline). Each rank starts at its
    recorded offset from the first rank's step start; times in the op table are ms from there.
    link_only: a collective ends at the link's end alone, not also no sooner than gloo's (module doc)."""
    world = max(progs) + 1
    ops, seq, state, waits = [], {}, {}, {}    # state: (r, op_id) -> (core id, kind, args)
    ports = {r: Ports() for r in progs}
    issued: dict = {}                          # collective key -> {rank: recorded issue µs}

    def transfer(r, a, ranks):
        """The op's end from its start on rank r's port (the link's rule, planning.link.Ports)."""
        lat, tr = link.cost(a["op"], ranks, int(a.get("bytes") or 0))
        return lambda t: ports[r].queue(link.port(ranks), t, lat * 1e9, tr * 1e9)

    def as_emulated(a, key, ranks, on_link):
        """A collective's end: the link's, and no sooner than gloo's recorded own time after its
        start (recorded end less the last member's recorded issue; unknown: the link's alone)."""
        if link_only or a.get("recorded_end_us") is None:
            return on_link

        def end(t):
            got, held = issued.get(key, {}), on_link(t)
            if len(got) < len(ranks):                # a member issued it outside this step
                return held
            return max(held, t + (a["recorded_end_us"] - max(got.values())) * 1e3)
        return end

    for r, p in progs.items():
        for i, it in enumerate(p["items"]):
            if it[0] == "busy":
                ops.append(Op(("busy", r, i), r, it[1] * compute_scale))
            elif it[0] == "issue":
                a = it[1]
                base, kind, ranks = match_key(a["op"], r, a.get("peer"), a.get("tag", 0),
                                              a.get("group"),
                                              members(plan, a.get("group"), r, world))
                n = seq[r, base, kind] = seq.get((r, base, kind), -1) + 1
                key = base + (n,)
                if kind == "send":                   # eager: its end is known at its issue
                    op = Op(("send", key), r, holds=False, finish=transfer(r, a, ranks))
                elif kind == "recv":                 # ends at its send's end, or at its issue
                    op = Op(("recv", key), r, holds=False, eager=False, after=(Dep(("send", key)),))
                else:                                # the last member's issue, then the port
                    issued.setdefault(key, {})[r] = a.get("recorded_issue_us")
                    op = Op(("coll", key, r), r, holds=False, eager=False, group=key,
                            group_size=len(ranks),
                            finish=as_emulated(a, key, ranks, transfer(r, a, ranks)))
                ops.append(op)
                state[r, a["op_id"]] = (op.id, kind, a)
            elif (r, it[1]) in state:                # else: waited op issued before this step
                own = 0.0 if link_only or len(it) < 4 else it[3] * 1e3
                ops.append(Op(("wait", r, i), r, own, after=(Dep(state[r, it[1]][0]),),
                              floor=it[2] * 1e3 if floor else 0.0))
                waits.setdefault((r, it[1]), []).append(("wait", r, i))
    try:                                             # each rank from its recorded offset, in ns
        got = run(ops, {r: p.get("offset", 0.0) * 1e3 for r, p in progs.items()})
    except Stuck as e:
        raise TraceError(f"ranks {sorted(e.blocked)} wait on ops no peer issued in this step: "
                         f"the trace's ops do not pair up; record whole steps (partui run --trace)")
    t = got.ops
    busy = {r: [] for r in progs}
    for o in ops:
        if o.id[0] == "busy":
            busy[o.lane].append((t[o.id].start, t[o.id].end))
    waits = {k: [(t[w].reached, t[w].end) for w in ws] for k, ws in waits.items()}
    waited = {r: 0.0 for r in progs}                 # time blocked in waits
    flight = {r: [] for r in progs}
    op_rows = []
    reach = {cid: n for n, cid in enumerate(t)}      # rows in the order the replay issued them
    for (r, op_id), (cid, kind, a) in sorted(state.items(), key=lambda kv: reach[kv[1][0]]):
        t_issue, end = t[cid].reached, t[cid].end    # end None: a recv or collective never waited
        if end is not None:
            flight[r].append((t_issue, end))
        w = waits.get((r, op_id)) or []
        waited[r] += sum(t1 - t0 for t0, t1 in w)
        op_rows.append({"rank": r, "op_id": op_id, "op": a["op"], "group": a.get("group"),
                        "bytes": int(a.get("bytes") or 0), "issue_ms": t_issue / 1e6,
                        "end_ms": None if end is None else end / 1e6,
                        "wait_ms": sum(t1 - t0 for t0, t1 in w) / 1e6,
                        "wait_return_ms": w[0][1] / 1e6 if w else None})
    clock, start = got.lane_end, {r: p.get("offset", 0.0) * 1e3 for r, p in progs.items()}
    rows = []
    for r in sorted(progs):
        fl, bz = merge(flight[r]), merge(busy[r])
        inflight = length(fl)
        rows.append({"rank": r, "recorded_step_ms": (progs[r]["end"] - progs[r]["start"]) / 1e3,
                     "predicted_step_ms": (clock[r] - start[r]) / 1e6,
                     "blocked_ms": waited[r] / 1e6,
                     "comm_in_flight_ms": inflight / 1e6,
                     "busy_overlap_pct": 100 * intersect(fl, bz) / inflight if inflight else None,
                     "replayed_busy_ms": length(bz) / 1e6})
    return pd.DataFrame(rows), pd.DataFrame(op_rows)


def replay(doc: dict, link: LinkModel, compute_scale: float = 1.0, step: int | None = None,
           floor: bool = False, overlap: bool = True, link_only: bool = False) -> pd.DataFrame:
    """Predicted figures per rank (and recorded step time) of one step under `link`. floor: a
    wait lasts at least as long as it did in the recording (what this machine's gloo took: the
    live emulation cannot hand bytes over before gloo does). link_only: a collective ends at the
    link's end alone (module doc). overlap=False: every send and collective waited right after its
    issue (without_overlap)."""
    progs = programs(doc, step)
    meta = doc.get("metadata") or {}
    plan = Plan.from_dict(meta["plan"]) if "plan" in meta else None
    return defined(simulate(progs if overlap else without_overlap(progs), link, compute_scale, floor,
                            plan, link_only)[0])


SAVED_COLUMNS = ("rank", "comm_in_flight_ms", "blocked_ms", "predicted_step_ms", "no_overlap_step_ms",
                 "saved_ms")   # defined in partui.analysis.figures.definitions (view "Trace tab saved")


def saved(doc: dict, link: LinkModel) -> pd.DataFrame:
    """Per rank and for the step ("step" row: the slowest rank), mean over the recorded steps
    (the first left out when there are more): SAVED_COLUMNS under `link`."""
    meta = doc.get("metadata") or {}
    plan = Plan.from_dict(meta["plan"]) if "plan" in meta else None
    frames, steps = [], []
    for s in steps_of(doc):
        progs = programs(doc, s)
        with_ov = simulate(progs, link, plan=plan)[0]
        without = simulate(without_overlap(progs), link, plan=plan)[0]
        t = pd.DataFrame({"rank": with_ov["rank"], "comm_in_flight_ms": with_ov["comm_in_flight_ms"],
                          "blocked_ms": with_ov["blocked_ms"],
                          "predicted_step_ms": with_ov["predicted_step_ms"],
                          "no_overlap_step_ms": without["predicted_step_ms"]})
        frames.append(t)
        steps.append({"predicted_step_ms": t["predicted_step_ms"].max(),
                      "no_overlap_step_ms": t["no_overlap_step_ms"].max()})
    out = pd.concat(frames).groupby("rank", as_index=False).mean()
    out["saved_ms"] = out["no_overlap_step_ms"] - out["predicted_step_ms"]
    step = pd.DataFrame(steps).mean()
    row = {"rank": "step", "comm_in_flight_ms": None, "blocked_ms": None,
           "predicted_step_ms": step["predicted_step_ms"],
           "no_overlap_step_ms": step["no_overlap_step_ms"],
           "saved_ms": step["no_overlap_step_ms"] - step["predicted_step_ms"]}
    out = pd.concat([out.astype({"rank": object}), pd.DataFrame([row])], ignore_index=True)
    out = out[list(SAVED_COLUMNS)]
    out.attrs["definitions"] = definitions_of(out.columns)
    return out
