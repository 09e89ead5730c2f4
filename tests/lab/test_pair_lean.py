"""`partui report --by pair` on a torch.profiler trace with part annotations: the pandas-free path
(report_lean: kineto_lean's arrays into pair_parts) prints what the frame path prints, byte for byte, in
every format, on DeepSeek's real pair and on hand-built ones; both equal a plain-Python reading of the
raw events (the oracle below: no partui code); and it loads no pandas."""
import gzip
import json
import os
import re
import subprocess
import sys

import pytest
from interval_oracle import covered, length, merged
from lean_traces import A2A_KERNEL, gpu_doc, parts_doc, write
from test_report_lean import FORMATS, REAL, ROOT, imported, needs_real, odd, same

from partui.analysis import load
from partui.analysis.reading import kineto_lean
from partui.analysis.reading.kineto_lean import lean_pairs, read_gpu_trace
from partui.analysis.figures.kineto_pairs import kineto_pairs
from partui.cli import build_parser
from partui.commands.report_frames import run_frames
from partui.commands.report_lean import lean_report

DEEPSEEK = os.path.join(REAL, "deepseek-profile-data", "train.json.gz")
PART = re.compile(r"^(attn|mlp|dispatch|combine)\(([FBW])\)$")


@needs_real
@pytest.mark.parametrize("fmt", FORMATS)
def test_deepseeks_pair_prints_the_same_in_every_format(capsys, fmt):
    out = same(capsys, DEEPSEEK, "--by", "pair", "--format", fmt, "--rows", "7")
    if fmt == "table":
        assert "more rows not shown" in out and "F&B parts:" in out and "planner's order, measured costs" in out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hand_built_pairs_print_the_same(tmp_path, capsys, fmt, seed):
    path = write(tmp_path / "parts.json", parts_doc(seed=seed))
    same(capsys, path, "--by", "pair", "--format", fmt)


def test_a_directory_of_ranks_prints_the_same(tmp_path, capsys):
    folder = tmp_path / "ranks"
    folder.mkdir()
    for r in range(3):
        write(folder / f"rank-{r}.json", parts_doc(rank=r, world=3, layers=2, seed=5))
    for fmt in FORMATS:
        same(capsys, folder, "--by", "pair", "--format", fmt)


def oracle(doc: dict) -> list[dict]:
    """The --by pair rows of one rank's trace read straight from its events: each kernel is the part's
    whose annotation holds the start of the CPU call carrying its correlation id; a part's figures are
    its kernels merged, its comm kernels merged, and those inside / outside every compute kernel."""
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    ann = sorted((e for e in ev if e["cat"] == "user_annotation"), key=lambda e: e["ts"])
    parts = [e for e in ann if PART.match(e["name"])]
    holders = [e for e in ann if not PART.match(e["name"]) and not e["name"].startswith("ProfilerStep#")]
    calls = {}
    for e in ev:
        if e["cat"] == "cuda_runtime":
            calls.setdefault(e["args"]["correlation"], e["ts"])
    kernels = [e for e in ev if e["cat"] == "kernel" and e["dur"] > 0]
    owner = []
    for k in kernels:
        launch = calls.get(k["args"]["correlation"])
        inside = [i for i, p in enumerate(parts) if launch is not None and p["ts"] <= launch <= p["ts"] + p["dur"]]
        owner.append(inside[0] if inside else -1)
    compute = [(k["ts"], k["ts"] + k["dur"], o) for k, o in zip(kernels, owner) if k["name"] != A2A_KERNEL]
    busy = merged([(a, b) for a, b, _ in compute])
    seen, rows = {}, []
    for i, p in enumerate(parts):
        layer = seen.get(p["name"], 0)
        seen[p["name"]] = layer + 1
        mine = [k for k, o in zip(kernels, owner) if o == i]
        flight = merged([(k["ts"], k["ts"] + k["dur"]) for k in mine if k["name"] == A2A_KERNEL])
        under = {o for a, b, o in compute for fa, fb in flight if a < fb and b > fa and o not in (i, -1)}
        held = [h for h in holders if h["ts"] <= p["ts"] and h["ts"] + h["dur"] >= p["ts"] + p["dur"]]
        hidden = covered(flight, busy)
        rows.append({"pair": min(held, key=lambda h: h["dur"])["name"] if held else "", "layer_k": layer,
                     "annotation": p["name"], "launched": len(mine),
                     "gpu_ms": length(merged([(k["ts"], k["ts"] + k["dur"]) for k in mine])) / 1e3,
                     "a2a_ms": length(flight) / 1e3, "a2a_under_ms": hidden / 1e3,
                     "a2a_exposed_ms": (length(flight) - hidden) / 1e3, "under": sorted(under)})
    labels = [f"{r['annotation']} L{r['layer_k']}" for r in rows]
    for r in rows:
        r["under"] = ", ".join(labels[i] for i in r["under"])
    return rows


@pytest.mark.parametrize("seed", [0, 3, 4])
def test_the_figures_equal_a_plain_reading_of_the_events(tmp_path, seed):
    """Both readers' tables (unrounded) against the oracle."""
    doc = parts_doc(layers=4, seed=seed)
    path = write(tmp_path / "parts.json", doc)
    want = oracle(doc)
    lean = lean_pairs(read_gpu_trace(path)).table
    frame = kineto_pairs(load(path)).to_dict(orient="list")
    for got in (lean, frame):
        assert len(got["rank"]) == len(want) == 41 and set(got["rank"]) == {0}
        for i, w in enumerate(want):
            for key, value in w.items():
                assert got[key][i] == (pytest.approx(value, abs=1e-12) if isinstance(value, float) else value), key
    assert sum(r["launched"] for r in want) == sum(e.get("cat") == "cuda_runtime" for e in doc["traceEvents"]) - 2
    assert {r["pair"] for r in want} == {"1F1B", "DualPipe"}
    assert any(r["a2a_exposed_ms"] > 0 for r in want) and any(r["under"] for r in want)


def test_a_pair_report_loads_no_pandas(tmp_path):
    path = write(tmp_path / "parts.json", parts_doc())
    env = dict(os.environ, PARTUI_TRACE_CACHE="0", PYTHONPATH=ROOT)
    for fmt in ("json", "table"):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "partui", "report", path, "--by", "pair",
                               "--format", fmt], check=False, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "pandas" not in imported(proc)
        assert "a2a_exposed_ms" in proc.stdout


def test_a_trace_without_parts_falls_through_to_the_frame_path(tmp_path, capsys):
    doc = parts_doc()
    for e in doc["traceEvents"]:
        e["name"] = e["name"].replace("(", "[") if PART.match(e.get("name", "")) else e.get("name")
    path = write(tmp_path / "plain.json", doc)
    args = build_parser("report").parse_args(["report", path, "--by", "pair"])
    assert lean_report(args, None) is None
    assert run_frames(args, None) == 2
    assert "holds no F&B pairs" in capsys.readouterr().err


@pytest.mark.parametrize("doc", [parts_doc(seed=7), gpu_doc(n=300, seed=4), gpu_doc(steps=0, orphans=60),
                                 odd(gpu_doc(n=80), "no dur"), odd(gpu_doc(n=80), "text times"),
                                 odd(gpu_doc(n=80), "no ts"), odd(gpu_doc(n=80), "numeric text tids")],
                         ids=["parts", "gpu", "no steps, no calls", "no dur", "text times", "no ts", "text tids"])
@pytest.mark.parametrize("gz", [False, True], ids=["json", "gz"])
def test_a_streamed_read_prints_what_a_whole_read_prints(tmp_path, capsys, monkeypatch, doc, gz):
    """A file of kineto_lean.WHOLE_MAX bytes or more is read batch by batch (analysis/streamed): forced
    here on small files, both reports print what the whole read (and so the frame path) prints."""
    path = str(tmp_path / ("t.json.gz" if gz else "t.json"))
    with (gzip.open(path, "wt") if gz else open(path, "w")) as f:
        json.dump(doc, f, indent=1 if gz else None)   # pretty-printed and compact
    by = ["--by", "pair"] if any(PART.match(e.get("name", "")) for e in doc["traceEvents"]) else []
    outs = []
    for whole_max in (1 << 40, 0):
        monkeypatch.setattr(kineto_lean, "WHOLE_MAX", whole_max)
        outs.append(same(capsys, path, *by, "--format", "table", "--rows", "all"))
    assert outs[0] == outs[1]


def test_a_long_lean_read_shows_progress_on_a_terminal_only(tmp_path, capsys, monkeypatch):
    """The pandas-free reader's progress line (as reader.load's): a streamed read's bytes and events, then
    the line cleared; rank files done in a directory; nothing when not asked (json, a pipe)."""
    from partui.analysis.reading import json_stream, progress
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    monkeypatch.setattr(json_stream, "BLOCK", 4096)
    monkeypatch.setattr(kineto_lean, "WHOLE_MAX", 0)
    path = write(tmp_path / "t.json", gpu_doc(n=300))
    read_gpu_trace(path, progress=False)
    assert capsys.readouterr().err == ""
    read_gpu_trace(path, progress=True)
    err = capsys.readouterr().err
    assert re.search(r"reading t\.json: \d+ of \d+ MB read, [\d,]+ events", err) and err.endswith("\r\x1b[K")
    folder = tmp_path / "ranks"
    folder.mkdir()
    for r in range(2):
        write(folder / f"rank-{r}.json", gpu_doc(rank=r, n=50))
    read_gpu_trace(str(folder), progress=True)
    assert "reading ranks: 2 of 2 rank files read" in capsys.readouterr().err
