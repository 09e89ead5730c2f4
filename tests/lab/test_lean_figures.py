"""The pandas-free GPU report's figures against plain Python written here (no partui code): each kernel in
the step its launch falls in, each step's kernels merged by hand; and its spelling of a table (json, csv,
to_string, markdown) against pandas' own on random tables."""
import json

import numpy as np
import pandas as pd
import pytest
from interval_oracle import covered as inside, length, merged
from lean_traces import gpu_doc, rank_folder

from partui.cli import build_parser
from partui.commands.lean_render import csv_text, json_rows, markdown_text, string_text
from partui.commands.report_lean import lean_report
from partui.commands.report_render import render

COMM = ("nccl", "dpsk::ep::", "Memcpy PtoP")


def oracle(doc):
    """Per rank: window, compute, comm, overlapped (us) summed over steps, by a loop over the events."""
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in xs if e["cat"] == "user_annotation")
    launch = {e["args"]["correlation"]: e["ts"] for e in xs if e["cat"] == "cuda_runtime"}
    per = {}
    for e in xs:
        comm = any(c in e["name"] for c in COMM)
        if e["cat"] not in ("kernel", "gpu_memcpy", "gpu_memset") or not (comm or e["cat"] == "kernel"):
            continue
        t = launch.get(e["args"]["correlation"])
        inside_step = [s for s in steps if s[0] <= (e["ts"] if t is None else t)]
        step = inside_step[-1] if inside_step else None
        if step is None or (t is not None and t > step[1]):
            continue   # launched outside every step
        per.setdefault(step[2], []).append((e["ts"], e["ts"] + e["dur"], comm))
    out = np.zeros(4)
    for kernels in per.values():
        comp = merged([(a, b) for a, b, c in kernels if not c])
        comm = merged([(a, b) for a, b, c in kernels if c])
        out += [max(b for _, b, _ in kernels) - min(a for a, _, _ in kernels), length(comp), length(comm),
                inside(comm, comp)]
    return out


def report(capsys, path):
    capsys.readouterr()
    args = build_parser("report").parse_args(["report", str(path), "--format", "json"])
    assert lean_report(args, None) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_ranks_figures_are_its_steps_kernels_merged_by_hand(tmp_path, capsys, seed):
    folder = rank_folder(tmp_path / "ranks", world=3, n=120, seed=seed)
    got = report(capsys, folder)
    assert [r["rank"] for r in got["rows"]] == [0, 1, 2]
    for row, gpu in zip(got["rows"], got["gpu"]):
        window, compute, comm, overlapped = oracle(gpu_doc(rank=row["rank"], world=3, n=120, seed=seed)) / 1e3
        assert row["window_ms"] == pytest.approx(window, abs=1e-3)
        assert row["compute_ms"] == pytest.approx(compute, abs=1e-3)
        assert row["comm_ms"] == pytest.approx(comm, abs=1e-3)
        assert row["overlapped_ms"] == pytest.approx(overlapped, abs=1e-3)
        assert gpu["compute_idle_ms"] == pytest.approx(window - compute, abs=2e-3)
        assert row["overlap_pct"] == pytest.approx(100 * overlapped / comm, abs=1e-3)


def random_table(rng, n):
    scale = 10.0 ** rng.integers(-8, 10)
    t = {"rank": rng.integers(0, 20, n).astype(np.int64),
         "stream": np.array([str(rng.choice(["stream 7 ", "stream 40 ", "x", "?", "a,b"])) for _ in range(n)],
                            dtype=object),
         "a_ms": rng.uniform(0, 1, n) * scale, "b_pct": np.where(rng.random(n) < 0.3, np.nan, rng.uniform(0, 100, n)),
         "c_ms": np.round(rng.uniform(-1, 1, n) * scale, int(rng.integers(0, 5))),
         "kernels": rng.integers(0, 10 ** int(rng.integers(1, 8)), n).astype(np.int64)}
    if rng.random() < 0.1:
        t["c_ms"][:] = np.nan
    return t


def test_tables_are_spelt_as_pandas_spells_them():
    rng = np.random.default_rng(7)
    for _ in range(400):
        t = random_table(rng, int(rng.integers(1, 6)))
        df = pd.DataFrame(t)
        assert csv_text(t) == render(df, "csv")
        assert markdown_text(t) == render(df, "markdown")
        assert string_text(t) == render(df, "table")
        assert json.dumps(json_rows(t)) == json.dumps(json.loads(df.round(3).to_json(orient="records")))
