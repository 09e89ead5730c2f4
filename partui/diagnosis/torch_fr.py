"""torch's own flight recorder, read (torch-free: its dumps are pickles of plain Python values).

torch records each process group's collectives and p2p ops in a ring of TORCH_FR_BUFFER_SIZE
entries per rank (NCCL, and gloo in torch 2.13) and writes it, as a pickle, to
TORCH_FR_DUMP_TEMP_FILE + rank: on NCCL's watchdog timeout, or when partui asks
(`torch._C._distributed_c10d._dump_fr_trace`, partui/world/torchrun.py). Each entry carries its group
(process_group: (name, desc)), collective_seq_id or p2p_seq_id, profiling_name ("gloo:all_reduce"),
input / output sizes and dtypes, its state and times. `to_dump` turns one file per rank into
partui's dump shape, so `partui doctor` gives the same verdict on either.
"""
from __future__ import annotations

import glob
import math
import os
import pickle
import re

# torch's dtype names in the dump -> partui's (torch.float32's str without "torch.")
DTYPES = {"Float": "float32", "Double": "float64", "BFloat16": "bfloat16", "Half": "float16",
          "Long": "int64", "Int": "int32", "Char": "int8", "Byte": "uint8", "Bool": "bool"}
OPS = {"allreduce": "all_reduce", "all_reduce": "all_reduce", "broadcast": "broadcast",
       "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
       "all_gather_into_tensor_coalesced": "all_gather", "reduce_scatter": "reduce_scatter",
       "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
       "alltoall_base": "all_to_all", "alltoall": "all_to_all", "all_to_all": "all_to_all",
       "barrier": "barrier", "send": "send", "recv": "recv"}


def rank_files(prefix: str) -> dict[int, str]:
    """{rank: path} of the dumps torch wrote as PREFIX<rank> (a folder: any *<rank> inside)."""
    pattern = os.path.join(prefix, "*") if os.path.isdir(prefix) else prefix + "*"
    out = {}
    for path in sorted(glob.glob(pattern)):
        m = re.search(r"(\d+)$", path)
        if m and os.path.isfile(path):
            out[int(m.group(1))] = path
    return out


def is_torch_dump(path: str) -> bool:
    """Whether path (a file, a folder or a PREFIX) holds torch flight recorder pickles."""
    files = rank_files(path) if not os.path.isfile(path) else {0: path}
    for p in files.values():
        with open(p, "rb") as f:
            return f.read(1) == b"\x80"       # a pickle's protocol opcode
    return False


def _op(name: str) -> str:
    op = name.split(":", 1)[-1]
    return OPS.get(op, op)


DEFAULT_GROUP = "world"   # torch's default_pg: partui's name for the group of every rank


def _group(entry: dict) -> str:
    name, desc = entry["process_group"]
    if desc == "default_pg":
        return DEFAULT_GROUP
    return desc if desc and desc not in ("undefined",) else f"pg{name}"


def records(doc: dict, rank: int, members: dict) -> list[dict]:
    """One rank's entries as partui.diagnosis.doctor's records. members: {group: ranks} seen across dumps."""
    out = []
    for e in doc.get("entries", []):
        group, op = _group(e), _op(e["profiling_name"])
        p2p = e.get("is_p2p") or op in ("send", "recv")
        done = e.get("time_discovered_completed_ns") or (
            e["time_created_ns"] if e.get("state") == "completed" else None)
        out.append({"seq": e["p2p_seq_id"] if p2p else e["collective_seq_id"],
                    "comms_id": 0, "op": op, "group": group, "ranks": members.get(group, []),
                    "peer": e.get("dst_rank") if op == "send" else e.get("src_rank") if p2p else None,
                    "tag": 0, "bytes": 0, "shapes": e.get("input_sizes") or [],
                    "dtypes": [DTYPES.get(d, d) for d in e.get("input_dtypes") or []],
                    "step": None, "span": None, "t_issue": e["time_created_ns"],
                    "t_posted": e.get("time_discovered_started_ns"), "t_complete": done})
    return out


def infer_completion(recs: list[dict], entered: dict, members: dict,
                     present: set) -> dict | None:
    """gloo's entries stay "scheduled" (torch 2.13 tracks no completion for gloo, and a timed-out
    op is retired like a finished one). When no entry of a rank says it completed: a collective
    every member entered is taken as completed (nothing says otherwise), one only some entered
    cannot have completed; the rank is taken as blocked in its oldest such op, else its newest
    (an async op waited in issue order). entered: {(group, seq): ranks whose dumps hold it};
    present: the ranks that left a dump (a missing one's side is unknown, not absent).
    Returns that wait, or None when completion is known."""
    if not recs or any(r["t_complete"] is not None for r in recs):
        return None
    newest = max(recs, key=lambda r: r["t_issue"])
    unfinished = []
    for r in recs:
        if set(members.get(r["group"], ())) & present <= entered.get((r["group"], r["seq"]), set()):
            if r is not newest:
                r["t_complete"] = r["t_issue"]
        else:
            unfinished.append(r)
    blocked = min(unfinished, key=lambda r: r["t_issue"]) if unfinished else newest
    return {"since": blocked["t_issue"], "group": blocked["group"], "op": blocked["op"],
            "seq": blocked["seq"], "inferred": True}


def _members(docs: dict, world: int) -> tuple[dict, list[str]]:
    """Each group's ranks: torch's pg_config where it names them (NCCL), else the ranks whose
    dumps hold an entry of that group (gloo leaves pg_config's ranks empty). A group only one rank
    has entries of cannot be a group of one (no op of one is ever waited in): it is taken as the
    whole world, and named in the second item (exact in a world of two, a guess beyond)."""
    seen: dict[str, set] = {}
    for rank, doc in docs.items():
        for e in doc.get("entries", []):
            seen.setdefault(_group(e), set()).add(rank)
    named = set()
    for doc in docs.values():
        for cfg in (doc.get("pg_config") or {}).values():
            ranks = eval_ranks(cfg.get("ranks"))
            if ranks and cfg.get("desc"):
                seen[cfg["desc"] if cfg["desc"] != "default_pg" else DEFAULT_GROUP] = set(ranks)
                named.add(cfg["desc"])
    guessed = sorted(g for g, r in seen.items() if len(r) == 1 and g not in named and world > 1)
    for g in guessed:
        seen[g] = set(range(world))
    return {g: sorted(r) for g, r in seen.items()}, guessed


def eval_ranks(text) -> list[int]:
    """pg_config's ranks: a list, or its text '[0, 1]' (never eval'd: digits only)."""
    if isinstance(text, (list, tuple)):
        return [int(r) for r in text]
    return [int(x) for x in re.findall(r"\d+", str(text or ""))]


def to_dump(path: str, world: int | None = None) -> dict:
    """torch's per-rank pickles at path (a PREFIX, a folder or one file) as a partui dump."""
    files = rank_files(path) if not os.path.isfile(path) else {0: path}
    if world:                         # an earlier, wider world's files under the same prefix
        files = {r: p for r, p in files.items() if r < world}
    if not files:
        raise FileNotFoundError(f"no torch flight recorder dumps at {path} (TORCH_FR_DUMP_TEMP_FILE"
                                f" + rank): give the prefix torch wrote them under")
    docs = {}
    for rank, p in files.items():
        with open(p, "rb") as f:
            docs[rank] = pickle.load(f)   # torch's own dump format; only open dumps you trust
    world = world or world_size(docs) or max(docs) + 1
    members, guessed = _members(docs, world)
    recs = {r: records(doc, r, members) for r, doc in sorted(docs.items())}
    entered: dict = {}
    for r, rs in recs.items():
        for rec in rs:
            entered.setdefault((rec["group"], rec["seq"]), set()).add(r)
    ranks = [{"rank": r, "step": None, "span": None, "waiting": infer_completion(rs, entered, members, set(docs)),
              "groups": members, "records": rs} for r, rs in recs.items()]
    inferred = any(rk["waiting"] is not None for rk in ranks)
    absent = sorted(set(range(world)) - set(docs))
    return {"format": "torch-fr", "world": world, "reason": f"torch flight recorder dumps {path}",
            "ranks": ranks, "absent": absent, "completion": "inferred" if inferred else "recorded",
            "notes": missing_facts(docs, absent, guessed, inferred)}


def world_size(docs: dict) -> int | None:
    """The world's size from a default-group all-gather (its output holds every rank's input):
    gloo's dumps name no ranks, and a rank that left no dump must still count as missing."""
    for doc in docs.values():
        for e in doc.get("entries", []):
            ins, outs = e.get("input_sizes") or [], e.get("output_sizes") or []
            if e["process_group"][1] == "default_pg" and _op(e["profiling_name"]) == "all_gather" \
                    and len(ins) == len(outs) == 1 and ins[0] and math.prod(outs[0]) % math.prod(ins[0]) == 0:
                return math.prod(outs[0]) // math.prod(ins[0])
    return None


def missing_facts(docs: dict, absent: list[int], guessed: list[str], inferred: bool) -> list[str]:
    """What torch's dumps do not hold, and why, so a verdict on them says what it could not see."""
    gloo = any(e["profiling_name"].startswith("gloo:") for d in docs.values()
               for e in d.get("entries", []))
    notes = []
    if absent:
        notes.append(f"rank(s) {absent} left no torch dump: torch writes one only when asked or on "
                     f"NCCL's watchdog, and a rank gloo aborts (a size mismatch) or that is killed "
                     f"first writes none; its side of any op is unknown here (partui's dump keeps "
                     f"its last ops: partui doctor PREFIX --with partui.json)")
    if gloo:
        notes.append("torch records no p2p op (send / recv) under gloo: a rank blocked in one "
                     "shows as blocked in its last collective, and an unmatched send cannot be "
                     "seen here (partui's dump records every p2p op: --with partui.json)")
    if inferred:
        notes.append("torch tracks no completion under gloo: a collective every member entered is "
                     "taken as completed, and each rank as waiting in its oldest op some member "
                     "never entered (else its newest)")
    if guessed:
        notes.append(f"group(s) {guessed}: gloo's dump names no members and only one rank entered "
                     f"them; taken as the whole world (partui's dump names them: --with partui.json)")
    return notes
