"""The step graphs (partui.analysis.replay.opgraph) of a partui trace, any plan: each rank's recorded
step as a program (partui.analysis.replay.whatif.programs: busy stretches, comm issues and waits), one
lane per rank.
    busy         a compute node lasting the recorded stretch (compute and the host work around it)
    comm issue   a collective member, grouped with the other members' issue of the same op
                 (planning.link.match_key's group, p2p by src, dst, tag; which op of it: its
                 Comms Id where every op carries one, else a collective's Seq, else the n-th
                 on that key, `matching`): the group starts at the last member's issue; every
                 member ends one transfer later
    wait         blocks the rank until its op ends
A group's transfer: a member's wait end less the last issue (0 if negative) bounds it, and is it
when that wait began by the last issue (it saw the whole transfer). A pipeline sends eagerly and
waits its sends at the step's end, so a send's bound is most of the step: a p2p pair takes its
recv's, a collective its members' least. `measured`: that wait saw the whole transfer (blame
takes typical comm from those; a recv waited late, after its bytes came, only bounds it).
Types (for typical durations): the k-th busy stretch of a stage's program; a comm op's name and
process group. dp rank and stage come from the trace's plan.
"""
from __future__ import annotations

from partui.analysis.table.events import TraceError
from partui.analysis.replay.opgraph import Node, StepGraph
from partui.analysis.replay.whatif import members, programs, steps_of
from planning.link import match_key
from planning.mesh import Plan, coords


def _timeline(prog: dict) -> list:
    """(item, µs from the rank's step start) per item, from the recorded lengths."""
    out, t = [], 0.0
    for it in prog["items"]:
        out.append((it, t))
        if it[0] == "busy":
            t += it[1] / 1e3
        elif it[0] == "wait":
            t += it[2]
    return out


def partui_graphs(doc: dict) -> list[StepGraph]:
    """One StepGraph per recorded step (the first left out when there are more), times in s."""
    meta = doc.get("metadata") or {}
    plan = Plan.from_dict(meta["plan"]) if "plan" in meta else None
    if not any(e.get("ph") == "X" and e.get("cat") == "step" for e in doc.get("traceEvents", [])):
        raise TraceError("the trace has no step spans (no step ids): record it with partui run --trace")
    steps = steps_of(doc)
    progs = {s: programs(doc, s) for s in steps}
    ranks = {s: sorted(p) for s, p in progs.items()}
    every = sorted(set().union(*map(set, ranks.values())))
    for s, rs in ranks.items():
        if rs != every:
            lack = sorted(set(every) - set(rs))
            raise TraceError(f"rank {lack[0]} did not record step {s}: every rank needs the same steps")
    how = matching(progs)
    graphs = [_graph(s, progs[s], plan, how) for s in steps]
    for g in graphs:
        g.matched_by = how
    return graphs


# the comm event args that name one op across its group's ranks (kernels/comm records them as
# Kineto's torch.profiler traces do): its process group, its sequence number there, its id
GROUP_NAME, SEQ, COMMS_ID = "Process Group Name", "Seq", "Comms Id"


def matching(progs: dict) -> str:
    """How the same op is found on each rank: "comms id" when every comm issue carries one (an
    op's id is the same on every rank of its group, whatever order a rank issued it in); else
    "seq" when every collective carries its Seq (p2p then by order); else "order" (the n-th op
    of a kind on one group is the same op on every member: a reordered rank is then misread)."""
    issues = [it[1] for p in progs.values() for r in p.values() for it in r["items"]
              if it[0] == "issue"]
    if issues and all(COMMS_ID in a for a in issues):
        return "comms id"
    coll = [a for a in issues if a["op"] not in ("send", "recv")]
    if coll and all(SEQ in a for a in coll):
        return "seq"
    return "order"


def identity(a: dict, how: str):
    """The op's own identity under `how` (None: count it in order)."""
    group = a.get(GROUP_NAME, a.get("group"))
    if how == "comms id":
        return ("comms id", group, a[COMMS_ID])
    if how == "seq" and a["op"] not in ("send", "recv"):
        return ("seq", group, a[SEQ])
    return None


def _graph(step: int, progs: dict, plan: Plan | None, how: str = "order") -> StepGraph:
    world = max(progs) + 1
    where = {r: coords(plan, r) if plan is not None else {"dp": r, "pp": 0} for r in progs}
    seq: dict = {}
    issued: dict = {}                       # (rank, op_id) -> (group key, absolute issue µs)
    members_of: dict = {}                   # group key -> [(rank, issue µs, op_id)]
    waited: dict = {}                       # (rank, op_id) -> (absolute wait end, start µs)
    plan_items = {}
    for r, p in progs.items():
        items = []
        for it, t in _timeline(p):
            at = p["start"] + t
            if it[0] == "issue":
                a = it[1]
                base, kind, ranks = match_key(a["op"], r, a.get("peer"), a.get("tag", 0),
                                              a.get("group"), members(plan, a.get("group"), r, world))
                ident = identity(a, how)
                if ident is None:
                    ident = seq[r, base] = seq.get((r, base), -1) + 1
                key = base + (ident,)
                issued[r, a["op_id"]] = (key, at)
                members_of.setdefault(key, []).append((r, at, a["op_id"]))
            elif it[0] == "wait":
                waited[r, it[1]] = (at + it[2], at)
            items.append((it, t))
        plan_items[r] = items
    transfer = {key: _transfer(key, ms, waited) for key, ms in members_of.items()}
    g = StepGraph(step, typical="fastest")
    g.recorded = (max(p["end"] for p in progs.values()) - min(p["start"] for p in progs.values())) / 1e6
    for r, items in plan_items.items():
        dp, stage = where[r].get("dp", 0), where[r].get("pp", 0)
        lane, k = (r, "main"), 0
        for i, (it, t) in enumerate(items):
            at = progs[r]["start"] + t
            if it[0] == "busy":
                g.spans[("busy", r, i)] = (r, at, at + it[1] / 1e3, None)
                g.nodes.append(Node(("busy", r, i), lane, it[1] / 1e9, ("busy", stage, k), r, dp,
                                    stage, kind="compute"))
                k += 1
            elif it[0] == "issue":
                a = it[1]
                key, _at = issued[r, a["op_id"]]
                dur, measured = transfer[key]
                grouped = len(members_of[key]) > 1
                g.spans[("comm", key, r)] = (r, at, at, a["op_id"])
                g.nodes.append(Node(("comm", key, r), lane, dur, ("comm", a["op"], a.get("group")),
                                    r, dp, stage, group=key if grouped else None, holds=False,
                                    eager=False, kind=a["op"], measured=measured))
            elif (r, it[1]) in issued:            # else: waited op issued before this step
                key = issued[r, it[1]][0]
                g.nodes.append(Node(("wait", r, i), lane, 0.0, "wait", r, dp, stage,
                                    after=(("comm", key, r),), marker=True))
    return g


def _transfer(key: tuple, ms: list, waited: dict) -> tuple[float, bool]:
    """(transfer s, measured) of one group (module doc): the bound of its recv (p2p) or the least
    of its members' bounds; measured when that member's wait began by the last issue. No wait
    seen: 0, unmeasured."""
    last = max(t for _r, t, _op in ms)
    ends = {r: waited[r, op] for r, _t, op in ms if (r, op) in waited}
    if key[0] == "p2p" and key[2] in ends:
        ends = {key[2]: ends[key[2]]}            # p2p key: ("p2p", src, dst, tag, n)
    if not ends:
        return 0.0, False
    end, began = min(ends.values())
    return max(0.0, end - last) / 1e6, began <= last
