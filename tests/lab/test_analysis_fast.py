"""The vectorized loader and sweep against a plain, independent computation (sorted interval lists in
pure Python) on the benchmark's own kind of trace, small: the same figures for every (rank, step)."""
import json

import pytest
from interval_oracle import length, merged

from partui.analysis import load, overlap
from partui.bench.analysis import synthetic_trace


def intersect(xs, ys):
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            out.append([a, b])
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(xs, ys):
    out = []
    for a, b in xs:
        cuts = [(c, d) for c, d in ys if d > a and c < b]
        t = a
        for c, d in cuts:
            if c > t:
                out.append([t, c])
            t = max(t, d)
        if b > t:
            out.append([t, b])
    return out


def plain_figures(doc):
    """Per (rank, step): compute outside waits, comm in flight, waits, overlap, idle, in us."""
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M"}
    rows = {}
    for step in (e for e in xs if e["cat"] == "step"):
        w0, w1 = step["ts"], step["ts"] + step["dur"]
        mine = [e for e in xs if e["pid"] == step["pid"] and e["cat"] != "step"]

        def cut(pred):
            return merged([(max(e["ts"], w0), min(e["ts"] + e["dur"], w1)) for e in mine if pred(e)])
        waits = cut(lambda e: e["cat"] in ("wait", "post"))
        comm = cut(lambda e: e["cat"] == "comm" and not lanes[(e["pid"], e["tid"])].startswith("compute"))
        compute = subtract(cut(lambda e: e["cat"] not in ("wait", "post", "comm")
                               and lanes[(e["pid"], e["tid"])].startswith("compute")), waits)
        rows[(step["pid"], step["args"]["step"])] = {
            "window": w1 - w0, "compute": length(compute), "comm": length(comm), "wait": length(waits),
            "overlapped": length(intersect(comm, compute)),
            "idle": (w1 - w0) - length(merged(compute + comm))}
    return rows


def test_fast_path_matches_a_plain_interval_computation(tmp_path):
    doc = synthetic_trace(3000, ranks=3, seed=7)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    got = overlap(load(str(path)), "step").set_index(["rank", "step"])
    want = plain_figures(doc)
    assert sorted(got.index) == sorted(want)
    assert min(w["overlapped"] for w in want.values()) > 0 and min(w["wait"] for w in want.values()) > 0
    for key, w in want.items():
        g = got.loc[key]
        assert g["window_ms"] * 1e3 == pytest.approx(w["window"], rel=1e-12)
        for col in ("compute", "comm", "wait", "overlapped", "idle"):
            assert g[f"{col}_ms"] * 1e3 == pytest.approx(w[col], rel=1e-9, abs=1e-6), (key, col)
        assert g["exposed_comm_ms"] * 1e3 == pytest.approx(w["comm"] - w["overlapped"], rel=1e-9, abs=1e-6)
