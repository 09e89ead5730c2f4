"""Every bad input a new user tried exits 2 with one line naming the problem and a fix that is itself
valid, before any process starts; `partui report` refuses broken traces the same way; Ctrl-C prints
one line, exits 130 and leaves no process."""
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, run_cli
from partui.commands.run import cap_trace_steps, trace_size_warning

FLAG = re.compile(r"--([a-z-]+)(?: (-?[\w.]+))?")

RUN_BAD = [  # (flags, words the one line must hold)
    (["--steps", "0"], "--steps 5"),
    (["--steps", "-1"], "--steps 5"),
    (["--steps", "0", "--check"], "--steps 5"),
    (["--world", "-1"], "pick world in 0, 1"),
    (["--world", "-4", "--tp", "2"], "pick world in 0, 4"),
    (["--timeout", "0"], "--timeout 120"),
    (["--timeout", "-5"], "--timeout 120"),
    (["--experts", "-4"], "pick experts in 0, 4"),
    (["--tp", "3", "--dim", "48", "--heads", "3", "--kv-heads", "3"], "--tp 1"),
    (["--overlap", "--dp", "8", "--experts", "4"], "--dp 4"),
    (["--pp", "4", "--schedule", "dualpipe", "--microbatches", "5", "--batch", "10"],
     "--microbatches 10"),
    (["--dp", "3", "--ep", "3", "--experts", "4"], "--ep 1"),
    (["--overlap", "--batch", "6", "--experts", "4", "--dp", "2"], "--batch 4"),
    (["--experts", "4", "--ep", "3"], "dp follows ep 3"),
]


def _suggested_flags(line: str) -> list[str]:
    """The first fix of a one-line message as flags (`set --tp 1 --vocab 258 or ...` -> its first
    alternative; `pick tp in 1, 2` -> --tp 1)."""
    pick = re.search(r"pick (\w+) in ([\w.-]+)", line)
    if pick:
        return ["--" + pick.group(1).replace("_", "-"), pick.group(2)]
    first = line.split(": set ", 1)[1].split(" or ")[0]
    out = []
    for flag, value in FLAG.findall(first):
        out += [f"--{flag}"] + ([value] if value else [])
    return out


def _without(args: list[str], flags: list[str]) -> list[str]:
    """args with every flag named in `flags` (and its value) removed."""
    names, out, i = {f for f in flags if f.startswith("--")}, [], 0
    while i < len(args):
        if args[i] in names:
            i += 1 if args[i] in ("--overlap", "--sp") else 2
            continue
        out.append(args[i])
        i += 1
    return out


@pytest.mark.parametrize("args,words", RUN_BAD, ids=[" ".join(a) for a, _ in RUN_BAD])
def test_bad_run_input_exits_2_with_one_line_and_a_fix_that_runs(args, words):
    proc = run_cli("run", *args, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("partui run: "), proc.stderr
    assert words in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and not proc.stdout
    if " set " in lines[0] or " pick " in lines[0]:   # the fix, applied, is accepted and runs
        fix = _suggested_flags(lines[0])
        if fix and not any(a in ("--steps", "--timeout") for a in fix):
            fixed = _without(args, fix) + [a for a in fix if a != "--no"]
            if "--overlap" in fix:
                fixed = [a for a in fixed if a != "--overlap"]
            ok = run_cli("run", *fixed, "--steps", 1, timeout=120)
            assert ok.returncode == 0, (fixed, ok.stderr[-2000:])


def test_trace_to_a_folder_is_refused_before_launch(tmp_path):
    proc = run_cli("run", "--trace", tmp_path, timeout=60)
    assert proc.returncode == 2 and "is a folder" in proc.stderr and not proc.stdout
    assert os.path.join(str(tmp_path), "run.json") in proc.stderr


def _write(path, doc, gz=False):
    raw = json.dumps(doc).encode()
    if gz:
        raw = gzip.compress(raw)
        raw = raw[:30] + bytes(b ^ 0xFF for b in raw[30:60]) + raw[60:]   # a corrupt body
    path.write_bytes(raw)
    return path


PARTUI_META = {"format": "partui-trace/1"}


@pytest.mark.parametrize("doc,gz,words", [
    ({"traceEvents": [{"ph": "X"}] * 50, "metadata": PARTUI_META}, True, "corrupt"),
    ({"traceEvents": [1, "a", None], "metadata": PARTUI_META}, False, "event 0 is int"),
    ({"traceEvents": [], "metadata": PARTUI_META}, False, "no events"),
    ({"traceEvents": [{"ph": "X", "pid": "rank0", "tid": 0, "ts": 0, "dur": 1, "name": "F",
                       "cat": "compute"}], "metadata": PARTUI_META}, False, "do not read"),
])
def test_report_refuses_broken_traces_in_one_line(tmp_path, doc, gz, words):
    path = _write(tmp_path / ("t.json.gz" if gz else "t.json"), doc, gz)
    proc = run_cli("report", path, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr, proc.stderr


def test_report_plot_into_a_missing_folder_is_refused(tmp_path):
    proc = run_cli("report", "nothing.json", "--plot", tmp_path / "no" / "x.png", timeout=60)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_a_world_larger_than_the_machine_warns_with_the_figure():
    cpus = len(os.sched_getaffinity(0))
    world = 2 * cpus
    proc = run_cli("run", "--dp", world, "--batch", world, "--steps", 1, "--layers", 1, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert f"world {world} puts {world} rank processes on {cpus} usable CPU(s)" in proc.stderr


def _session_pids(sid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{d}/stat").read()
        except (OSError, ValueError):
            continue
        if d.isdigit() and int(stat.rsplit(")", 1)[1].split()[3]) == sid:
            out.append(int(d))
    return out


def test_ctrl_c_prints_one_line_exits_130_and_leaves_no_process():
    p = subprocess.Popen([sys.executable, "-m", "partui", "run", "--dp", "2", "--steps", "300"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        assert p.stdout.readline().startswith("step"), "no first step"
        os.killpg(p.pid, signal.SIGINT)                 # what a terminal's Ctrl-C does
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130
    assert err.strip().splitlines() == ["partui run: interrupted"], err
    deadline = time.monotonic() + 10
    while _session_pids(p.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _session_pids(p.pid), "rank or helper processes outlived the run"


def test_a_long_trace_keeps_the_last_50_steps_unless_uncapped():
    assert cap_trace_steps(set(range(60)), uncapped=False) == set(range(10, 60))
    assert cap_trace_steps(set(range(60)), uncapped=True) == set(range(60))
    assert cap_trace_steps(set(range(5)), uncapped=False) == set(range(5))


def test_the_trace_size_warning_on_a_known_answer():
    # 812 events (100,000 bytes) a step: 60 steps 48,720 events 6.0 MB; the last 50 40,600, 5.0 MB
    text = trace_size_warning(set(range(60)), set(range(10, 60)), 0, 812, 100_000)
    assert ("tracing 60 steps is about 48,720 events, 6.0 MB of JSON (812 events a step on step 0"
            in text)
    assert "recording the last 50 (steps 10:60, about 40,600 events, 5.0 MB of JSON)" in text
    assert "--trace-uncapped records all 60" in text
    whole = trace_size_warning(set(range(60)), set(range(60)), 0, 812, 100_000)
    assert "recording" not in whole and "records all of it" in whole


def test_a_long_trace_warns_with_its_measured_size_and_keeps_the_cap(tmp_path):
    out = tmp_path / "long.json"
    proc = run_cli("run", "--dp", 2, "--layers", 1, "--steps", 55, "--trace", out, timeout=180)
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"tracing 55 steps is about ([\d,]+) events.*\(([\d,]+) events a step on step 0, "
                  r"every rank\); recording the last 50 \(steps 5:55, about ([\d,]+) events",
                  proc.stderr)
    assert m, proc.stderr
    total, per_step, capped = (int(g.replace(",", "")) for g in m.groups())
    assert total == 55 * per_step and capped == 50 * per_step and per_step > 0
    trace = json.loads(out.read_text())
    recorded = [e for e in trace["traceEvents"] if e.get("ph") != "M"]   # less track names
    assert trace["metadata"]["steps"] == [5, 54]
    assert 0.8 * capped <= len(recorded) <= 1.2 * capped, (len(recorded), capped)
    quiet = run_cli("run", "--layers", 1, "--steps", 3, "--trace", tmp_path / "short.json",
                    timeout=120)
    assert quiet.returncode == 0 and "warning" not in quiet.stderr
