"""`partui report` against HTA on one real torch.profiler trace, each side timed as its own whole
process (interpreter start, imports, read, analysis, output), as a user would run them.

HTA (HolisticTraceAnalysis) pulls in jupyterlab and plotly, so it is kept out of partui's venv: the
bench runs it in whichever python has it, named by `--hta-python PATH` or $PARTUI_HTA_PYTHON, else
this interpreter when it imports hta. Each side runs once untimed first (the trace in the page cache,
each side's bytecode written where its interpreter may write it), then timed; each side's imports
alone are timed too, to say what dominates a small trace's run.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time

HTA_ENV = "PARTUI_HTA_PYTHON"
HTA_GOAL = 0.25  # partui report / HTA get_comm_comp_overlap, whole process (issue 36)
HTA_RUN = ("import sys; from hta.trace_analysis import TraceAnalysis; "
           "print(TraceAnalysis(trace_dir=sys.argv[1]).get_comm_comp_overlap().to_json())")
HTA_IMPORT = "from hta.trace_analysis import TraceAnalysis"
PARTUI_IMPORT = "import partui.cli, partui.commands.report"


def checked_hta_python(path: str, named: str = "--hta-python") -> str:
    """`path` when it is a python that imports hta, else ValueError naming the problem and a fix."""
    exe = os.path.abspath(os.path.expanduser(path))
    fix = (f"point {named} at a venv's bin/python where HTA is installed "
           f"(python -m venv DIR && DIR/bin/pip install HolisticTraceAnalysis)")
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        raise ValueError(f"{named} {path}: no executable file there; {fix}")
    try:
        got = subprocess.run([exe, "-c", "import hta"], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"{named} {path}: it did not run ({exc}); {fix}") from None
    if got.returncode:
        last = (got.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"{named} {path}: it cannot import hta ({last}); {fix}")
    return exe


def hta_python_arg(text: str) -> str:
    """argparse type of --hta-python."""
    try:
        return checked_hta_python(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--hta-python {text}: ")) from None


def find_hta_python(given: str | None = None) -> str | None:
    """The python that runs HTA: `given` (checked already), else $PARTUI_HTA_PYTHON (checked here:
    ValueError when it cannot import hta), else this interpreter when it imports hta, else None."""
    if given:
        return given
    if os.environ.get(HTA_ENV):
        return checked_hta_python(os.environ[HTA_ENV], f"${HTA_ENV}")
    return sys.executable if importlib.util.find_spec("hta") is not None else None


def whole_process(argv: list[str], env: dict | None = None, timeout_s: float = 1800) -> dict:
    """Run argv as its own process: its stdout, wall seconds, CPU seconds (user + system) and peak
    RSS (MB, the kernel's account of that process alone); RuntimeError with its stderr when it
    fails or runs past timeout_s (then killed)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        killer = threading.Timer(timeout_s, proc.kill)  # wait4 (for this child's own rusage) has no timeout
        killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        wall = time.perf_counter() - t0
        out.seek(0), err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status):
        why = f"ran past {timeout_s:g} s" if wall >= timeout_s else "failed"
        raise RuntimeError(f"{' '.join(argv)} {why}: {stderr.strip()[-2000:]}")
    return {"out": stdout, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "rss_mb": usage.ru_maxrss / 1024}


def timed_twice(argv: list[str], env: dict, timeout_s: float) -> dict:
    whole_process(argv, env, timeout_s)  # untimed: page cache, bytecode
    return whole_process(argv, env, timeout_s)


def report_vs_hta(real: str, folder: str, hta_python: str | None, timeout_s: float = 1800) -> dict:
    """partui report and HTA's get_comm_comp_overlap on `real`, each side whole-process and its
    imports alone: {"partui": ..., "partui_import": ..., and with HTA "hta", "hta_import"}."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as installed: with .pyc
    env["PARTUI_TRACE_CACHE"] = "0"  # the trace is read, not its cache
    got = {"partui": timed_twice([sys.executable, "-m", "partui", "report", real, "--format", "json"], env, timeout_s),
           "partui_import": timed_twice([sys.executable, "-c", PARTUI_IMPORT], env, timeout_s)}
    if hta_python:
        alone = os.path.join(folder, "hta-input")  # HTA reads a directory of rank files
        os.makedirs(alone, exist_ok=True)
        link = os.path.join(alone, "rank0" + (".json.gz" if real.endswith(".gz") else ".json"))
        if not os.path.exists(link):
            os.symlink(os.path.abspath(real), link)
        got["hta"] = timed_twice([hta_python, "-c", HTA_RUN, alone], env, timeout_s)
        got["hta_import"] = timed_twice([hta_python, "-c", HTA_IMPORT], env, timeout_s)
    return got


def describe_vs_hta(real: str, got: dict) -> str:
    """The comparison's lines, each figure saying what it counts."""
    p, pi = got["partui"], got["partui_import"]
    line = (f"partui report {os.path.basename(real)} (whole process): {p['wall_s']:.2f} s wall, {p['cpu_s']:.2f} s CPU, "
            f"peak RSS {p['rss_mb']:.0f} MB; of which importing partui's report command: {pi['wall_s']:.2f} s wall, "
            f"{pi['cpu_s']:.2f} s CPU")
    if "hta" not in got:
        return (line + f"\n  HTA is not installed here: no ratio (--hta-python PATH or ${HTA_ENV} names a python "
                "that has it; pip install HolisticTraceAnalysis)")
    h, hi = got["hta"], got["hta_import"]
    return "\n".join([
        line,
        f"HTA get_comm_comp_overlap, same trace (whole process): {h['wall_s']:.2f} s wall, {h['cpu_s']:.2f} s CPU, "
        f"peak RSS {h['rss_mb']:.0f} MB; of which importing HTA: {hi['wall_s']:.2f} s wall, {hi['cpu_s']:.2f} s CPU",
        f"  partui / HTA: {p['wall_s'] / h['wall_s']:.2f} wall, {p['cpu_s'] / h['cpu_s']:.2f} CPU (goal <= {HTA_GOAL}); "
        f"without either's imports: {(p['cpu_s'] - pi['cpu_s']) / max(h['cpu_s'] - hi['cpu_s'], 1e-9):.2f} CPU"])
