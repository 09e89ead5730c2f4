"""`partui report` on a torch.profiler GPU trace without pandas (report_lean) prints what the frame path
(report_frames) prints, byte for byte, in every format, on every real torch.profiler trace and on
hand-built ones of every shape; it loads no pandas; what it does not serve falls through unchanged."""
import os
import subprocess
import sys

import pytest
from lean_traces import cpu_doc, gpu_doc, rank_folder, write

from partui.cli import build_parser
from partui.commands.report_frames import run_frames
from partui.commands.report_lean import lean_report
from partui.commands.report_rows import rows_shown

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REAL = os.path.join(ROOT, "..", "shared", "real-traces")
REAL_TRACES = [os.path.join(REAL, "hta-tests", n) for n in ("nccl_data.json.gz", "sampled_rank-0.json.gz",
                                                          "sampled_rank-1.json.gz")] \
    + [os.path.join(REAL, "deepseek-profile-data", "train.json.gz")]
FORMATS = ("json", "csv", "table", "markdown")
needs_real = pytest.mark.skipif(not os.path.isdir(REAL), reason="../shared/real-traces is absent (CI has it "
                                                                "beside the checkout)")


def both(capsys, *argv):
    """(what the lean path printed, what the frame path printed) for `partui report ARGV`; the lean path
    must serve it."""
    args = build_parser("report").parse_args(["report", *map(str, argv)])
    limit = rows_shown(args.rows)
    capsys.readouterr()
    assert lean_report(args, limit) == 0, "the lean path did not serve this GPU report"
    lean = capsys.readouterr()
    assert run_frames(args, limit) == 0
    return lean, capsys.readouterr()


def same(capsys, *argv) -> str:
    """The lean path serves `partui report ARGV` and prints what the frame path prints (returned)."""
    lean, frames = both(capsys, *argv)
    assert lean.out == frames.out
    assert lean.err == frames.err
    assert lean.out.strip()
    return lean.out


@needs_real
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", REAL_TRACES, ids=os.path.basename)
def test_every_real_trace_prints_the_same_in_every_format(capsys, path, fmt):
    same(capsys, path, "--format", fmt)


@needs_real
def test_the_real_traces_with_the_last_step_and_a_pattern_print_the_same(capsys):
    for path in REAL_TRACES:
        same(capsys, path, "--format", "json", "--include-last-step", "--comm-kernels", "elementwise")


@pytest.mark.parametrize("shape", [
    {}, {"steps": 0}, {"steps": 1}, {"comm": False}, {"orphans": 0}, {"orphans": 9, "n": 30},
    {"n": 400, "seed": 3}, {"names": False}, {"orphans": 60}])   # orphans 60: no CPU call carries an id
@pytest.mark.parametrize("fmt", FORMATS)
def test_hand_built_traces_print_the_same(tmp_path, capsys, shape, fmt):
    path = write(tmp_path / "rank0.json", gpu_doc(**shape))
    same(capsys, path, "--format", fmt)
    same(capsys, path, "--format", fmt, "--include-last-step", "--rows", "1")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_directory_of_rank_files_prints_the_same(tmp_path, capsys, fmt):
    folder = rank_folder(tmp_path / "ranks", world=3, n=80)
    same(capsys, folder, "--format", fmt, "--rows", "2")
    same(capsys, folder, "--format", fmt, "--comm-kernels", "my_a2a", "--comm-kernels", "sgemm")


def test_a_gzip_file_and_a_file_without_comm_in_a_world_of_two_print_the_same(tmp_path, capsys):
    import gzip
    import json
    path = tmp_path / "quiet.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(gpu_doc(comm=False), f)
    lean, _ = both(capsys, path, "--format", "json")
    assert "no GPU kernel matched a comm family" in lean.out   # the warning reaches json readers
    same(capsys, path, "--format", "table")


def test_what_the_lean_path_does_not_serve_falls_through(tmp_path, capsys):
    gpu = write(tmp_path / "gpu.json", gpu_doc())
    cpu = write(tmp_path / "cpu.json", cpu_doc())
    for argv in ([cpu], [gpu, "--by", "step"], [gpu, "--vs", gpu], [gpu, "--comm-kernels", "(bad"]):
        args = build_parser("report").parse_args(["report", *argv])
        assert lean_report(args, rows_shown(args.rows)) is None, argv
    mixed = rank_folder(tmp_path / "mixed", world=2)
    write(os.path.join(mixed, "rank-1.json"), gpu_doc(rank=1, world=4))   # another job's world size
    args = build_parser("report").parse_args(["report", mixed])
    assert lean_report(args, None) is None


def run(*argv):
    env = dict(os.environ, PARTUI_TRACE_CACHE="0", PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "partui", *map(str, argv)],
                          check=False, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)


def imported(proc) -> set:
    return {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


def test_a_gpu_report_loads_no_pandas_and_a_cpu_one_still_works(tmp_path):
    gpu = write(tmp_path / "gpu.json", gpu_doc())
    lean = run("report", gpu, "--format", "json")
    assert lean.returncode == 0, lean.stderr[-2000:]
    assert '"comm_comp_overlap_pct"' in lean.stdout
    assert "pandas" not in imported(lean)
    assert "pandas" not in imported(run("report", "--help"))
    cpu = run("report", write(tmp_path / "cpu.json", cpu_doc()), "--format", "json")
    assert cpu.returncode == 0, cpu.stderr[-2000:]
    assert '"overlap_pct"' in cpu.stdout and "pandas" in imported(cpu)
    bad = run("report", gpu, "--comm-kernels", "(bad")
    assert bad.returncode == 2 and "--comm-kernels '(bad': not a valid regular expression" in bad.stderr


def odd(doc, how):
    """The hand-built trace with one kind of oddity the JSON allows."""
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    if how == "no dur":
        for e in xs[::7]:
            e.pop("dur")
    elif how == "text times":
        for e in xs[::5]:
            e["ts"] = str(e["ts"])
    elif how == "no ts":
        for e in xs[::9]:
            e.pop("ts")
    elif how == "args not an object":
        xs[3]["args"] = [1, 2]
    elif how == "numeric text tids":
        for e in doc["traceEvents"]:
            e["pid"], e["tid"] = str(e.get("pid", 0)).replace("Spans", "3"), str(e.get("tid", 0))
    elif how == "a name that is a number":
        xs[2]["name"] = 7
    return doc


@pytest.mark.parametrize("how, served", [("no dur", True), ("text times", True), ("no ts", True),
                                         ("args not an object", False), ("numeric text tids", True),
                                         ("a name that is a number", False)])
def test_odd_events_print_the_same_or_fall_through(tmp_path, capsys, how, served):
    path = write(tmp_path / "odd.json", odd(gpu_doc(n=80), how))
    args = build_parser("report").parse_args(["report", path, "--format", "table"])
    assert (lean_report(args, 40) == 0) == served
    lean = capsys.readouterr()
    run_frames(args, 40)
    if served:
        assert lean.out == capsys.readouterr().out
