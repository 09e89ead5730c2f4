"""The verdict on a flight dump (torch-free): which op the world stopped in, who entered it and who
did not, where the missing ranks are, and any mismatch of op, size or dtype with both sides.

A dump is {"format": "partui-flight", "world": N, "reason": str, "ranks": [per rank: {"rank",
"step", "span", "waiting", "groups", "records": [kernels.comm.flight.record_dict]}], "absent":
[ranks that gave none]}; torch's own flight recorder dumps are turned into the same shape by
partui/diagnosis/torch_fr.py. Ops are matched across ranks by identity (group, Seq; p2p by direction and tag),
never by their order in time.

The verdict, in the order it is looked for (the first found is the headline; the rest follow):
    mismatch   the same op (group, Seq) given different ops, sizes or dtypes by its ranks
    hang       a collective some members entered and did not complete, while others never entered
    unmatched  a p2p send with no recv posted for it (or a recv with no send)
    stuck      a collective every member entered that none completed
A hang is followed to its cause: the op its missing rank is blocked in, when another finding names
it; a chain back to its start is a deadlock (groups entered in opposite orders).
    ok         none of these: where lateness began (the first op entered at least half the
               widest spread apart, p2p pairs included) and its last entrant
"""
from __future__ import annotations

from collections import defaultdict

P2P = ("send", "recv")
SIZED = ("all_reduce", "broadcast", "reduce_scatter", "all_gather")


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def signature(rec: dict) -> tuple:
    """What must agree across the ranks of one collective (as kernels.comm.validate compares)."""
    if rec["op"] in SIZED:
        return rec["op"], tuple(_numel(s) for s in rec["shapes"]), tuple(rec["dtypes"])
    if rec["op"] == "all_to_all":
        return rec["op"], (), tuple(rec["dtypes"])
    return rec["op"], (), ()


def describe(rec: dict) -> str:
    """'dp all_reduce seq 7 float32[4096]': an op as one rank gave it."""
    tensors = " ".join(f"{d}{list(s)}" for s, d in zip(rec["shapes"], rec["dtypes"]))
    peer = f" peer {rec['peer']}" if rec["op"] in P2P else ""
    return f"{rec['group']} {rec['op']}{peer} seq {rec['seq']}" + (f" {tensors}" if tensors else "")


def _where(rank: dict) -> dict:
    """Where a rank is: its last completed op, its step and span, the op it is blocked on."""
    done = [r for r in rank["records"] if r["t_complete"] is not None]
    last = max(done, key=lambda r: r["t_complete"]) if done else None
    waiting = rank.get("waiting")
    return {"rank": rank["rank"], "step": rank.get("step"), "span": rank.get("span"),
            "last_completed": describe(last) if last else None,
            "waiting_on": (f"{waiting['group']} {waiting['op']} seq {waiting['seq']}"
                           + (" (inferred)" if waiting.get("inferred") else "")
                           if waiting else None)}


def _collectives(ranks: list[dict]):
    """{(group, member ranks): {seq: {rank: rec}}} and each rank's lowest Seq kept per group."""
    ops = defaultdict(lambda: defaultdict(dict))
    oldest = defaultdict(dict)
    for rk in ranks:
        for rec in rk["records"]:
            if rec["op"] in P2P:
                continue
            key = (rec["group"], tuple(rec["ranks"]))
            ops[key][rec["seq"]][rk["rank"]] = rec
            oldest[key][rk["rank"]] = min(oldest[key].get(rk["rank"], rec["seq"]), rec["seq"])
    return ops, oldest


def _mismatches(ops) -> list[dict]:
    out = []
    for (group, members), by_seq in ops.items():
        for seq in sorted(by_seq):
            recs = by_seq[seq]
            sigs = defaultdict(list)
            for r, rec in sorted(recs.items()):
                sigs[signature(rec)].append(r)
            if len(sigs) > 1:
                # the culprits: the ranks outside the largest agreeing side (all, when sides tie)
                sides = sorted(sigs.values(), key=len, reverse=True)
                culprits = sorted(r for s in sides[1:] for r in s) if len(sides[0]) > len(
                    sides[1]) else sorted(recs)
                out.append({"kind": "mismatch", "group": group, "ranks": list(members),
                            "seq": seq, "op": recs[min(recs)]["op"], "culprits": culprits,
                            "entered": sorted(recs), "missing": [],
                            "sides": [{"rank": r, "gave": describe(recs[r])} for r in sorted(recs)],
                            "t": min(rec["t_issue"] for rec in recs.values())})
                break
    return out


def _partial(ops, oldest, present: set) -> tuple[list[dict], list[dict]]:
    """Collectives entered by some members and not completed: hangs (someone never entered)
    and stuck ones (everyone entered)."""
    hangs, stuck = [], []
    for (group, members), by_seq in ops.items():
        for seq in sorted(by_seq):
            recs = by_seq[seq]
            if all(rec["t_complete"] is not None for rec in recs.values()):
                continue
            # a member whose ring no longer reaches back to seq entered it long ago
            missing = [m for m in members if m not in recs and m in present
                       and oldest[(group, members)].get(m, 0) <= seq]
            unknown = [m for m in members if m not in present]
            item = {"group": group, "ranks": list(members), "seq": seq,
                    "op": recs[min(recs)]["op"], "entered": sorted(recs),
                    "missing": sorted(missing + unknown), "culprits": sorted(missing + unknown),
                    "t": min(rec["t_issue"] for rec in recs.values())}
            if item["missing"]:
                hangs.append({"kind": "hang", **item})
                break                     # the group's later ops wait behind this one
            stuck.append({"kind": "stuck", **item})
    return hangs, stuck


def _unmatched(ranks: list[dict], present: set) -> list[dict]:
    """p2p by (group, src, dst, tag) and Seq: a side posted whose other side never was."""
    sides = defaultdict(dict)   # (group, src, dst, tag) -> {("send"|"recv", seq): rec}
    for rk in ranks:
        for rec in rk["records"]:
            if rec["op"] in P2P and rec["peer"] is not None:
                src, dst = (rk["rank"], rec["peer"]) if rec["op"] == "send" else (rec["peer"],
                                                                                 rk["rank"])
                sides[(rec["group"], src, dst, rec["tag"])][(rec["op"], rec["seq"])] = rec
    out = []
    for (group, src, dst, tag), recs in sides.items():
        sends = {s for op, s in recs if op == "send"}
        recvs = {s for op, s in recs if op == "recv"}
        lo = max(min(sends, default=0), min(recvs, default=0))   # both rings reach back this far
        for kind, mine, theirs, culprit in (("send", sends, recvs, dst), ("recv", recvs, sends, src)):
            if culprit not in present:
                continue
            extra = sorted(s for s in mine - theirs if s >= lo)
            if extra:
                rec = recs[(kind, extra[0])]
                out.append({"kind": "unmatched", "group": group, "ranks": [src, dst],
                            "seq": extra[0], "op": kind, "culprits": [culprit],
                            "entered": [src if kind == "send" else dst], "missing": [culprit],
                            "detail": (f"{kind} {src}->{dst} tag {tag} seq {extra[0]}: rank "
                                       f"{culprit} never posted its "
                                       f"{'recv' if kind == 'send' else 'send'} "
                                       f"({len(theirs)} against {len(mine)} {kind}s)"),
                            "t": rec["t_issue"]})
    return out


def _lateness(ops, ranks: list[dict]) -> dict | None:
    """Where lateness began: of the ops every side entered (collectives, and p2p pairs: a recv
    posted long before its send waits on the sender), those entered at least half the widest
    spread apart, the first in time; its last entrant is the late rank. A straggler's victims enter
    later ops late too, but only after it."""
    items = []
    for (group, members), by_seq in ops.items():
        for seq, recs in by_seq.items():
            if len(recs) == len(members) >= 2:
                items.append((group, list(members), seq, recs[min(recs)]["op"],
                              {r: rec["t_issue"] for r, rec in recs.items()}))
    pairs: dict = {}
    for rk in ranks:
        for rec in rk["records"]:
            if rec["op"] in P2P and rec["peer"] is not None:
                src = rk["rank"] if rec["op"] == "send" else rec["peer"]
                dst = rec["peer"] if rec["op"] == "send" else rk["rank"]
                pairs.setdefault((rec["group"], src, dst, rec["tag"], rec["seq"]), {})[
                    rk["rank"]] = rec["t_issue"]
    for (group, src, dst, _tag, seq), t in pairs.items():
        if len(t) == 2:
            items.append((group, [src, dst], seq, "send", t))
    if not items:
        return None
    spread = [max(t.values()) - min(t.values()) for *_, t in items]
    widest = max(spread)
    first = min((min(t.values()), i) for i, (*_, t) in enumerate(items) if spread[i] >= widest / 2)[1]
    group, members, seq, op, t = items[first]
    last = max(t, key=t.get)
    return {"kind": "ok", "group": group, "ranks": members, "seq": seq, "op": op,
            "entered": sorted(t), "missing": [], "culprits": [last],
            "spread_ms": round(spread[first] / 1e6, 3)}


def _cause(head: dict, findings: list[dict], ranks: list[dict]) -> dict:
    """Follow a hang to its cause: when a rank missing from it is blocked in an op that another
    finding names (an unmatched send, another hang), that finding is why. A chain that comes back
    to where it began is a deadlock: groups entered in opposite orders."""
    waiting = {rk["rank"]: rk["waiting"] for rk in ranks if rk.get("waiting")}
    chain = [head]
    while head["kind"] == "hang":
        nxt = None
        for m in head["missing"]:
            w = waiting.get(m)
            for f in findings:
                if f is not head and w and f["kind"] != "stuck" and f["group"] == w["group"] \
                        and f["seq"] == w["seq"] and m in f["entered"]:
                    nxt = f
        if nxt is None:
            return head
        if any(nxt is c for c in chain):
            loop = chain[next(i for i, c in enumerate(chain) if c is nxt):]
            return {**nxt, "kind": "deadlock", "cycle": [_short(c) for c in loop],
                    "culprits": sorted({r for c in loop for r in c["missing"]})}
        chain.append(nxt)
        head = nxt
    return head


def _short(f: dict) -> str:
    return f"{f['group']} {f['op']} seq {f['seq']} (in: {f['entered']}, waited for: {f['missing']})"


def verdict(dump: dict) -> dict:
    """{"headline": the first finding (or the lateness figure), "findings": all, "where": per rank}."""
    ranks = dump["ranks"]
    present = {rk["rank"] for rk in ranks}
    ops, oldest = _collectives(ranks)
    hangs, stuck = _partial(ops, oldest, present)
    findings = []
    if dump.get("completion") == "inferred":   # each rank's newest op only assumed unfinished
        stuck = []
    for found in (_mismatches(ops), hangs, _unmatched(ranks, present), stuck):
        findings += sorted(found, key=lambda f: f["t"])
    where = {rk["rank"]: _where(rk) for rk in ranks}
    absent = sorted(set(dump.get("absent", [])))
    head = _cause(findings[0], findings, ranks) if findings else \
        {"kind": "absent", "culprits": absent} if absent else \
        _lateness(ops, ranks) or {"kind": "ok", "culprits": []}
    if findings:
        findings = [head] + [f for f in findings if f is not head]
    return {"reason": dump.get("reason", ""), "headline": head, "findings": findings,
            "where": where, "absent": absent, "notes": list(dump.get("notes", [])),
            "sources": dump.get("sources", {})}


def render(v: dict) -> list[str]:
    """The verdict as lines: the headline, where each missing rank is, the other findings."""
    h = v["headline"]
    lines = [f"reason: {v['reason']}"] if v.get("reason") else []
    if h["kind"] == "absent":
        lines.append(f"no hang or mismatch among the ranks that answered, but rank(s) "
                     f"{h['culprits']} gave nothing: the fault, if any, is on their side")
    elif h["kind"] == "ok":
        if "group" in h:
            lines.append(f"no hang, no mismatch; lateness began at {h['group']} {h['op']} seq "
                         f"{h['seq']}: rank {h['culprits'][0]} entered last, {h['spread_ms']:.1f} "
                         f"ms after the first (entry spread: the first op entered at least half "
                         f"the widest spread apart)")
        else:
            lines.append("no hang, no mismatch, no collective entered by every member")
    else:
        lines.append(_finding_line(h))
        if h["kind"] == "mismatch":
            lines += [f"  rank {s['rank']} gave {s['gave']}" for s in h["sides"]]
        for r in h.get("missing", []):
            w = v["where"].get(r)
            if w is None:
                lines.append(f"  rank {r}: no flight record (died or frozen before its first op)")
                continue
            step = f"step {w['step']}, " if w["step"] is not None else ""
            lines.append(f"  rank {r} is at {step}span {w['span'] or '-'}, last "
                         f"completed {w['last_completed'] or 'nothing'}, waiting on "
                         f"{w['waiting_on'] or 'nothing (idle or computing)'}")
    lines += [f"also: {_finding_line(f)}" for f in v["findings"][1:6]]
    if v.get("absent") and not v.get("notes"):
        lines.append(f"rank(s) {v['absent']} did not answer (died or frozen): their last ops, "
                     f"where shown, come from the shared rows they left")
    lines += [f"missing: {n}" for n in v.get("notes", [])]
    lines += [f"source: {fact} from {src}" for fact, src in v.get("sources", {}).items()]
    return lines


def _finding_line(f: dict) -> str:
    culprit = f"culprit rank(s) {f['culprits']}"
    if f["kind"] == "mismatch":
        return (f"mismatch in {f['group']} {f['ranks']} {f['op']} seq {f['seq']}: the ranks gave "
                f"different ops, sizes or dtypes; {culprit}")
    if f["kind"] == "unmatched":
        return f"unmatched p2p in {f['group']}: {f['detail']}; {culprit}"
    if f["kind"] == "deadlock":
        return (f"deadlock: each rank waits in an op the other has not entered, groups entered in "
                f"opposite orders: {' <- '.join(f['cycle'])}; {culprit}")
    if f["kind"] == "hang":
        return (f"hang in {f['group']} {f['ranks']} {f['op']} seq {f['seq']}: entered by ranks "
                f"{f['entered']}, not by {f['missing']}; {culprit}")
    return (f"stuck in {f['group']} {f['ranks']} {f['op']} seq {f['seq']}: every member entered, "
            f"none completed")


def last_ops(dump: dict, n: int = 6) -> list[str]:
    """Each rank's last n ops as a timeline (ms from the earliest issue among them): issue -> completion,
    or `waiting` for one not completed; the app's doctor view."""
    recs = [r for rk in dump["ranks"] for r in rk["records"][-n:]]
    t0 = min((r["t_issue"] for r in recs if r.get("t_issue") is not None), default=0)
    lines = [f"each rank's last {n} ops (ms from the first issue shown; -> completion, or waiting)"]
    for rk in dump["ranks"]:
        ops = []
        for r in rk["records"][-n:]:
            start = (r["t_issue"] - t0) / 1e6 if r.get("t_issue") is not None else float("nan")
            end = f"{(r['t_complete'] - t0) / 1e6:.1f}" if r.get("t_complete") else "waiting"
            ops.append(f"{r['group']} {r['op']} #{r['seq']} [{start:.1f} -> {end}]")
        lines.append(f"rank {rk['rank']} (step {rk.get('step')}, span {rk.get('span') or '-'}): "
                     + (" · ".join(ops) or "no op yet"))
    return lines

