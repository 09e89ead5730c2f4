"""What a new user met (issue 28, the CLI half): any number answers at once; a trace is never lost
(an unwritable folder is refused before launch, a killed rank leaves NAME.partial.json that Perfetto
loads); a closed pipe ends quietly; --microbatches defaults to what the schedule takes."""
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from planning.config import ModelConfig
from planning.mesh import Plan, PlanError
from planning.pipeline.catalog import least_microbatches
from planning.validate import divisors, validate
from partui.cli import main

pytestmark = pytest.mark.timeout(600)


def cli(*argv):
    """partui.cli.main in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def test_divisors_against_a_plain_count():
    for n in (1, 2, 12, 36, 97, 100, 360, 1024):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


@pytest.mark.parametrize("tp", [3, 1000, 1024])   # the largest tp a Plan takes (MAX_DIM)
def test_the_tp_search_is_bounded_by_the_heads_not_by_the_number(tp):
    cfg = ModelConfig()                                 # 4 heads
    plan = Plan(tp=tp)
    with pytest.raises(PlanError) as first:
        validate(plan, cfg, suggest=False)
    with pytest.raises(PlanError) as named:             # the failing check's own candidates
        validate(plan, cfg, collect=first.value.check)
    assert named.value.candidates == [{"tp": d} for d in (1, 2, 4)]
    with pytest.raises(PlanError) as full:
        validate(plan, cfg)
    assert str(full.value) == f"tp {tp} does not divide 4 heads: pick tp=1 or tp=2 or tp=4" or \
        str(full.value).endswith("pick tp in 1, 2, 4"), str(full.value)


def test_plan_tp_100000_exits_2_at_once():
    # a hang guard, not a timing: the search above is what is bounded
    proc = run_cli("plan", "--tp", 100000, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "partui plan: tp 100000 must be <= 1024: pick tp in 1, 2, 4"


def test_top_k_offers_every_valid_value():
    rc, _, err = cli("plan", "--top-k", 5, "--experts", 4)
    assert rc == 2 and err.strip().endswith("pick --top-k in 1, 2, 3, 4"), err


def test_a_pipeline_too_deep_for_the_layers_keeps_the_pipeline():
    rc, _, err = cli("plan", "--pp", 4, "--layers", 2)
    assert rc == 2 and err.strip().endswith("set --layers 4 or --pp 2"), err


@pytest.mark.parametrize("schedule,pp,want", [("1f1b", 2, 2), ("zb1p", 4, 4), ("dualpipe", 2, 4),
                                              ("dualpipev", 2, 4), ("interleaved", 2, 2),
                                              ("gpipe", 4, 1)])
def test_microbatches_default_to_the_least_the_schedule_takes(schedule, pp, want):
    assert least_microbatches(schedule, pp) == want
    rc, out, err = cli("plan", "--pp", pp, "--schedule", schedule, "--layers", 8, "--json")
    assert rc == 0, err
    assert json.loads(out)["plan"]["microbatches"] == want


def test_the_plan_says_which_microbatches_it_took():
    rc, out, _ = cli("plan", "--pp", 2)
    assert rc == 0 and out.rstrip().endswith(
        "microbatches 2 (not given: the least 1f1b takes at pp 2 that divides the per-rank batch)")
    rc, out, _ = cli("plan", "--pp", 2, "--microbatches", 4)
    assert rc == 0 and "not given" not in out


def test_an_unknown_flag_shows_the_commands_own_usage():
    rc, _, err = cli("run", "--foo")
    assert rc == 2 and err.startswith("usage: partui run ") and "unrecognized arguments: --foo" in err
    rc, _, err = cli("plan", "--dp", 2, "--bar", 3)
    assert rc == 2 and err.startswith("usage: partui plan ") and "--bar 3" in err


class ClosedPipe(io.StringIO):
    def write(self, s):
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("argv", [["plan", "--dp", "2"], ["simulate", "--schedule", "1f1b", "--pp",
                                                          "2", "--microbatches", "4", "--timeline"],
                                  ["report", "traces/sample-dualpipev-ep.json.gz"],
                                  ["run", "--help"]])
def test_a_closed_pipe_ends_quietly_in_one_place(argv):
    err = io.StringIO()
    with contextlib.redirect_stdout(ClosedPipe()), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:     # --help exits through argparse, after its print
            rc = e.code
    assert rc == 0 and "Traceback" not in err.getvalue(), err.getvalue()


@pytest.mark.parametrize("argv", [["run", "--layers", "1", "--steps", "40"], ["plan", "--dp", "8",
                                                                             "--batch", "8"]])
def test_head_reads_one_line_and_the_command_exits_0(argv):
    p = subprocess.Popen([sys.executable, "-m", "partui", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert p.stdout.readline()
        p.stdout.close()                                 # what `| head -1` does after one line
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0 and b"Traceback" not in err, err.decode()[-2000:]


def test_an_unwritable_trace_folder_is_refused_before_launch(tmp_path):
    rc, out, err = cli("run", "--trace", "/proc/partui-run.json")      # no one may create files there
    assert rc == 2 and not out
    assert err.startswith("partui run: --trace /proc/partui-run.json: folder /proc cannot be written")
    if os.geteuid() != 0:                               # root writes through a mode of 0o555
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        rc, _, err = cli("run", "--trace", locked / "t.json")
        assert rc == 2 and f"folder {locked} cannot be written" in err


def _rank_pids(pid: int) -> list[int]:
    """The rank processes of a `partui run` (the forkserver's children)."""
    def children(p):
        try:
            return [int(c) for t in os.listdir(f"/proc/{p}/task")
                    for c in open(f"/proc/{p}/task/{t}/children").read().split()]
        except OSError:
            return []
    for kid in children(pid):
        try:
            cmd = open(f"/proc/{kid}/cmdline").read()
        except OSError:
            continue
        if "forkserver" in cmd:
            return children(kid)
    return []


def test_a_killed_rank_leaves_the_traced_steps_in_a_partial_file_perfetto_loads(tmp_path):
    asked = tmp_path / "run.json"
    p = subprocess.Popen([sys.executable, "-m", "partui", "run", "--dp", "2", "--layers", "1",
                          "--steps", "40", "--trace", str(asked)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for _ in range(10):
            assert p.stdout.readline().startswith("step"), "the run stopped before step 10"
        ranks = _rank_pids(p.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    partial = tmp_path / "run.partial.json"
    assert p.returncode == 1 and not asked.exists()
    assert str(partial) in err and "Traceback" not in err, err
    doc = json.loads(partial.read_text())
    first, last = doc["metadata"]["steps"]
    # steps 0..9 were printed, so fetched (a step's window is fetched before its line prints)
    assert first == 0 and 10 <= last + 1 < 40, doc["metadata"]["steps"]
    assert f"the {last + 1} traced steps done (0:{last + 1}) are in {partial}" in err, err
    spans = {(e["pid"], e["args"]["step"]) for e in doc["traceEvents"] if e.get("name") == "step"}
    assert spans == {(rank, step) for rank in (0, 1) for step in range(last + 1)}, sorted(spans)
    check = os.path.join(ROOT, "..", "shared", "tools", "perfetto", "check.py")
    if not os.path.exists(check) or shutil.which("node") is None:
        pytest.skip("Perfetto's importer (../shared/tools/perfetto, node) is not here: the partial "
                    "file was checked as JSON only")
    proc = subprocess.run([sys.executable, check, str(partial)], capture_output=True, text=True,
                          timeout=300)
    if proc.returncode == 2 or "No module named" in proc.stderr:
        pytest.skip(f"Perfetto's importer cannot start here: {proc.stderr.strip()[-200:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0 and report["problems"] == [], report
    assert report["slices"] > 0 and "rank 0" in report["processes"]


def test_trace_steps_without_trace_warns_and_one_step_reads_step(tmp_path):
    proc = run_cli("run", "--layers", 1, "--steps", 1, "--trace-steps", "0:1", timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "warning: --trace-steps 0:1 without --trace records nothing" in proc.stderr
    assert " · 1 step · " in proc.stdout


def test_report_by_pair_without_pairs_says_so(tmp_path):
    trace = tmp_path / "dp.json"
    run_cli("run", "--dp", 2, "--layers", 1, "--steps", 2, "--trace", trace, timeout=180, check_rc=0)
    rc, out, err = cli("report", trace, "--by", "pair")
    assert rc == 2 and not out and "holds no F&B pairs" in err and "DataFrame" not in err


def test_simulate_timeline_letters_show_the_kinds_without_colour():
    rc, out, _ = cli("simulate", "--schedule", "zb1p", "--pp", 2, "--microbatches", 4, "--timeline")
    assert rc == 0 and "\x1b[" not in out
    rows = out.splitlines()
    assert rows[1].split("│")[1].split() == ["F0", "F1", "·", "B0", "W0", "F2", "B1", "W1", "F3",
                                             "B2", "W2", "B3", "W3"]
    assert "cells: F forward, B backward, W weight grads, & an F&B pair" in out
    rc, out, _ = cli("simulate", "--schedule", "dualpipev", "--pp", 2, "--microbatches", 8,
                     "--timeline")
    assert rc == 0 and "&" in out.splitlines()[1]


def test_a_torchrun_port_in_use_is_one_line(tmp_path):
    import socket
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), PYTHONPATH=ROOT)
        proc = subprocess.run([sys.executable, "-m", "partui", "run", "--steps", "1", "--timeout",
                               "20"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"partui run: torchrun's rendezvous at 127.0.0.1:{port} failed")
    assert "in use" in proc.stderr and "--master-port" in proc.stderr


def test_the_negative_formula_bubble_is_explained():
    from partui.analysis.figures.definitions import FIGURES
    text = FIGURES["formula_bubble_pct"].counts
    assert "negative" in text and "W" in text

