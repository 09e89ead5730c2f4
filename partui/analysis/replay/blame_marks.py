"""A partui trace with blame's critical path marked for Perfetto: every slice on the path gets
args.critical_path = true, and one flow chain ("critical path") runs through them in path order,
so Perfetto draws the chain across ranks. The path is the slowest step's (partui.analysis.replay.blame):
a busy stretch marks the rank's compute slices inside it, a comm op its comm slice and waits."""
from __future__ import annotations

import gzip
import json

from partui.analysis.replay.blame import analyse
from partui.analysis.replay.partui_graph import partui_graphs
from partui.analysis.reading.reader import read_doc

FLOW_ID = 0x0C517           # one flow chain; partui's own flows use small ids per p2p pair


def mark_critical_path(doc: dict, spans: list) -> int:
    """Mark `spans` ((rank, t0 µs, t1 µs, op_id) from the critical path) in doc; slices marked."""
    events = doc["traceEvents"]
    chain = []
    for rank, t0, t1, op_id in spans:
        hit = []
        for e in events:
            if e.get("ph") != "X" or e.get("pid") != rank or e.get("cat") in ("step", "FEE"):
                continue
            a = e.get("args") or {}
            if op_id is not None:
                take = a.get("op_id") == op_id and e.get("cat") in ("comm", "wait") and "parent" not in a
            else:
                take = e.get("cat") not in ("comm", "wait") and t0 - 1e-3 <= e["ts"] and \
                    e["ts"] + e.get("dur", 0) <= t1 + 1e-3
            if take:
                e["args"] = dict(a, critical_path=True)
                hit.append(e)
        if hit:
            chain.append(min(hit, key=lambda e: (e["ts"], -e.get("dur", 0))))
    for k, e in enumerate(chain):
        ph = "s" if k == 0 else "f" if k == len(chain) - 1 else "t"
        flow = {"ph": ph, "id": FLOW_ID, "name": "critical path", "cat": "critical_path",
                "pid": e["pid"], "tid": e["tid"], "ts": e["ts"]}
        if ph == "f":
            flow["bp"] = "e"
        events.append(flow)
    return sum(1 for e in events if (e.get("args") or {}).get("critical_path"))


def write_marked(doc: dict, spans: list, out: str) -> int:
    """Mark `spans` in doc and write it to out (.json or .json.gz); slices marked."""
    n = mark_critical_path(doc, spans)
    with (gzip.open if out.endswith(".gz") else open)(out, "wt") as f:
        json.dump(doc, f)
    return n


def mark_trace(path: str) -> str:
    """`partui run --trace PATH --critical-path`: the saved trace marked in place; what was done."""
    result = analyse(partui_graphs(read_doc(path)))
    n = write_marked(read_doc(path), result["critical path"].attrs["spans"], path)
    return (f"critical path of step {result['critical path'].attrs.get('step')}: {n} slices "
            f"marked in {path} (args.critical_path, one flow chain; partui blame {path} for "
            f"the table)")
