"""torch's own flight recorder, read (torch-free: its dumps are pickles of plain Python values).

torch records each process group's collectives and p2p ops in a ring of TORCH_FR_BUFFER_SIZE
entries per rank (NCCL, and gloo in torch 2.13) and writes it, as a pickle, to
TORCH_FR_DUMP_TEMP_FILE + rank: on NCCL's watchdog timeout, or when partui asks
(`torch._C._distributed_c10d._dump_fr_trace`, partui/torchrun.py). Each entry carries its group
(process_group: (name, desc)), collective_seq_id or p2p_seq_id, profiling_name ("gloo:all_reduce"),
input / output sizes and dtypes, its state and times. `to_dump` turns one file per rank into
partui's dump shape, so `partui doctor` gives the same verdict on either.
"""
from __future__ import annotations

import glob
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


def _group(entry: dict) -> str:
    name, desc = entry["process_group"]
    return desc if desc and desc not in ("undefined",) else f"pg{name}"


def records(doc: dict, rank: int, members: dict) -> list[dict]:
    """One rank's entries as partui.doctor's records. members: {group: ranks} seen across dumps."""
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


def infer_completion(recs: list[dict]) -> dict | None:
    """gloo's entries stay "scheduled" (torch 2.13 tracks no completion for gloo, and a timed-out
    op is retired like a finished one): when no entry of a rank says it completed, the rank is
    taken as blocked in its newest op and every older one as completed. Returns that wait, or
    None when completion is known."""
    if not recs or any(r["t_complete"] is not None for r in recs):
        return None
    newest = max(recs, key=lambda r: r["t_issue"])
    for r in recs:
        if r is not newest:
            r["t_complete"] = r["t_issue"]
    return {"since": newest["t_issue"], "group": newest["group"], "op": newest["op"],
            "seq": newest["seq"]}


def _members(docs: dict) -> dict:
    """Each group's ranks: torch's pg_config where it names them (NCCL), else the ranks whose
    dumps hold an entry of that group (gloo leaves pg_config's ranks empty)."""
    seen: dict[str, set] = {}
    for rank, doc in docs.items():
        for e in doc.get("entries", []):
            seen.setdefault(_group(e), set()).add(rank)
        for name, cfg in (doc.get("pg_config") or {}).items():
            ranks = cfg.get("ranks")
            ranks = eval_ranks(ranks)
            if ranks and cfg.get("desc"):
                seen[cfg["desc"]] = set(ranks)
    return {g: sorted(r) for g, r in seen.items()}


def eval_ranks(text) -> list[int]:
    """pg_config's ranks: a list, or its text '[0, 1]' (never eval'd: digits only)."""
    if isinstance(text, (list, tuple)):
        return [int(r) for r in text]
    return [int(x) for x in re.findall(r"\d+", str(text or ""))]


def to_dump(path: str, world: int | None = None) -> dict:
    """torch's per-rank pickles at path (a PREFIX, a folder or one file) as a partui dump."""
    files = rank_files(path) if not os.path.isfile(path) else {0: path}
    if not files:
        raise FileNotFoundError(f"no torch flight recorder dumps at {path} (TORCH_FR_DUMP_TEMP_FILE"
                                f" + rank): give the prefix torch wrote them under")
    docs = {}
    for rank, p in files.items():
        with open(p, "rb") as f:
            docs[rank] = pickle.load(f)   # torch's own dump format; only open dumps you trust
    members = _members(docs)
    world = world or max(docs) + 1
    ranks = []
    for r, doc in sorted(docs.items()):
        recs = records(doc, r, members)
        ranks.append({"rank": r, "step": None, "span": None, "waiting": infer_completion(recs),
                      "groups": members, "records": recs})
    inferred = any(rk["waiting"] is not None for rk in ranks)
    return {"format": "torch-fr", "world": world, "reason": f"torch flight recorder dumps {path}",
            "ranks": ranks, "absent": sorted(set(range(world)) - set(docs)),
            "completion": "inferred" if inferred else "recorded"}
