"""torch's flight recorder dumps and partui's of the same run, laid together (torch-free): what
torch's dumps lack under gloo comes from partui's, and the verdict says which source gave each fact.

Kept from torch's dumps: every collective it recorded (group, Seq, op, sizes, dtypes, issue time).
Taken from partui's dump, where torch's lacks it:
    p2p ops         torch records no send / recv under gloo
    group members   gloo's pg_config names none
    where each rank waits   torch tracks no completion under gloo; partui records each wait
    a rank's records        when torch left no dump of it (a rank gloo aborted)
partui's times are its ranks' perf_counter clocks; each rank's part carries the wall time of its
dump (t_dump_wall beside t_dump), which puts them on torch's wall clock.
"""
from __future__ import annotations

import copy

P2P = ("send", "recv")


def _to_wall(rec: dict, offset: int) -> dict:
    """rec on torch's wall clock, its tensors as torch records them: the input only (partui keeps
    (input, output) of a gather, a scatter and an all-to-all)."""
    rec = dict(rec)
    if len(rec.get("shapes") or ()) > 1:
        rec["shapes"], rec["dtypes"] = rec["shapes"][:1], rec["dtypes"][:1]
    for key in ("t_issue", "t_posted", "t_complete"):
        if rec.get(key):
            rec[key] += offset
    return rec


def merge(torch_dump: dict, ours: dict) -> dict:
    """torch_dump (partui.diagnosis.torch_fr.to_dump) with partui's dump's facts added where torch's lacks
    them; "sources" names where each kind of fact came from."""
    out = copy.deepcopy(torch_dump)
    parts = {rk["rank"]: rk for rk in ours.get("ranks", [])}
    members: dict = {}
    for rk in parts.values():
        members.update({g: list(r) for g, r in (rk.get("groups") or {}).items()})
        for rec in rk["records"]:
            if rec.get("ranks"):
                members.setdefault(rec["group"], list(rec["ranks"]))
    sources = {"collectives": "torch's flight recorder"}
    had_p2p = any(r["op"] in P2P for rk in out["ranks"] for r in rk["records"])
    took_p2p = took_wait = False
    for rk in out["ranks"]:
        part = parts.get(rk["rank"])
        for rec in rk["records"]:
            if rec["group"] in members:
                rec["ranks"] = members[rec["group"]]
        if part is None:
            continue
        offset = part.get("t_dump_wall", 0) - part.get("t_dump", 0)
        if not had_p2p:
            mine = [_to_wall(r, offset) for r in part["records"] if r["op"] in P2P]
            rk["records"] = sorted(rk["records"] + mine, key=lambda r: r["t_issue"])
            took_p2p = took_p2p or bool(mine)
        if part.get("waiting") and (rk.get("waiting") is None or rk["waiting"].get("inferred")):
            w = part["waiting"]
            rk["waiting"] = {**w, "since": w["since"] + offset}
            rk["step"], rk["span"] = part.get("step"), part.get("span")
            took_wait = True
    have = {rk["rank"] for rk in out["ranks"]}
    added = sorted(r for r in out.get("absent", []) if r in parts)
    for r in added:
        part = parts[r]
        offset = part.get("t_dump_wall", 0) - part.get("t_dump", 0)
        out["ranks"].append({**part, "records": [_to_wall(x, offset) for x in part["records"]],
                             "waiting": part.get("waiting") and {
                                 **part["waiting"], "since": part["waiting"]["since"] + offset}})
    out["ranks"].sort(key=lambda rk: rk["rank"])
    out["absent"] = sorted(set(out.get("absent", [])) - have - set(added))
    for rk in out["ranks"]:
        rk["groups"] = {**rk.get("groups", {}), **members}
    if members:
        sources["group members"] = "partui's dump"
    if took_p2p:
        sources["p2p ops"] = "partui's dump (torch records none under gloo)"
    if took_wait:
        sources["where each rank waits"] = "partui's dump (torch's is only inferred under gloo)"
    if added:
        sources[f"rank(s) {added}'s ops"] = "partui's dump (torch left no dump of them)"
    out["notes"] = []              # each gap torch's dumps had is filled, or named by its source
    out["sources"] = sources
    out["reason"] = f"{torch_dump.get('reason', '')} with {ours.get('reason', 'partui dump')}"
    return out
