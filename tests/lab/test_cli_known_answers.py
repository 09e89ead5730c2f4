"""Issue 35's CLI items, each on an input with a known answer: --version and a bare unknown flag; the
conflicts decided (SGD's weight decay is real, checked against torch.optim; tp under --backward
autograd is exact with no "silently incorrect" fallback); report's row cap and a CPU trace's terms;
whatif and report on files that are not theirs; the summary's mean step says which steps it holds;
help texts; Kineto's own log lines filtered; and the Tour writes only ignored paths."""
import json
import os
import shlex
import subprocess

import pytest

from conftest import ROOT, run_cli, run_here
from partui.recording.profile import without_kineto_log
from partui.world.results import summary_text
from planning.pipeline.catalog import SCHEDULES
from test_bad_input_more import SAMPLE, refusal
from test_tour import tour_commands


def test_version_prints_the_installed_version_and_exits_0():
    rc, err, out = refusal("--version")
    assert rc == 0 and out.startswith("partui ") and not err, (rc, out, err)


def test_a_bare_unknown_flag_is_named_in_one_line_without_the_help():
    rc, err, out = refusal("--frobnicate")
    assert rc == 2 and not out
    assert err.strip().splitlines() == [
        "partui: error: unrecognized arguments: --frobnicate; the commands: run, plan, report, "
        "simulate, whatif, blame, doctor, bench, repl, app (partui --help; partui run --help)"]


def test_top_level_help_names_every_command():
    rc, _, out = refusal("--help")
    head = out.split("positional arguments")[0]
    assert rc == 0 and "`whatif`" in head and "`blame`" in head


def test_an_unknown_schedule_names_every_registered_schedule():
    rc, err, _ = refusal("plan --pp 2 --schedule foo")
    assert rc == 2 and f"(the schedule choices: {', '.join(SCHEDULES)})" in err
    assert len(SCHEDULES) == 6


def test_help_says_what_an_empty_default_and_microbatches_0_mean():
    rc, _, out = refusal("run --help")
    assert rc == 0 and "(default )" not in out
    text = " ".join(out.split())
    assert "R=F runs rank R's compute F times as long" in text and "(default: off)" in text
    assert "(default 0: the least the schedule takes that divides it)" in text


def test_sgd_weight_decay_is_applied_and_held_to_torch_optim():
    """SGD's decay is decoupled (w *= 1 - lr wd), which for plain SGD equals torch.optim.SGD's L2
    term: the autograd reference (torch.optim) is the oracle, and decay changes the loss."""
    with_wd = run_here("run", "--optim", "sgd", "--weight-decay", "0.5", "--check", "--reference",
                       "autograd", "--steps", 3, "--json", check_rc=0)
    without = run_here("run", "--optim", "sgd", "--steps", 3, "--json", check_rc=0)
    assert with_wd.lines[-1]["summary"]["check"] == "passed"
    assert with_wd.lines[-1]["summary"]["final_loss"] != without.lines[-1]["summary"]["final_loss"]


@pytest.mark.timeout(300)
def test_tp_under_the_autograd_backward_is_exact_without_torchs_fallback_warning():
    """The vocab-parallel loss all-reduces as Megatron's g (identity backward): autograd no longer
    backprops through c10d's in-place all-reduce (torch: "may be silently incorrect")."""
    proc = run_cli("run", "--tp", 2, "--sp", "--backward", "autograd", "--check", "--steps", 2,
                   "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.lines[-1]["summary"]["check"] == "passed"
    assert "silently incorrect" not in proc.stderr and "UserWarning" not in proc.stderr


def test_report_rows_caps_the_table_and_says_how_many_were_left_out():
    rc, _, csv = refusal(f"report {SAMPLE} --by pair --format csv")
    total = len(csv.strip().splitlines()) - 1              # every row: csv is never cut
    rc5, _, out = refusal(f"report {SAMPLE} --by pair --rows 5")
    lines = out.splitlines()
    note = next(i for i, ln in enumerate(lines) if ln.startswith("... "))
    assert rc == rc5 == 0 and total > 5 and note == 6        # the header and 5 rows
    assert lines[note] == (f"... {total - 5} more rows not shown (the first 5 of {total}; --rows all "
                           f"prints every one)")
    assert f"F&B pairs: {total} all-to-alls" in out          # the summary still over every row
    _, _, every = refusal(f"report {SAMPLE} --by pair --rows all")
    assert "more rows not shown" not in every


CPU_KINETO = {"schemaVersion": 1, "traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 40},
    {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": 45, "dur": 30}]}


def test_a_cpu_only_torch_profiler_trace_gets_its_own_terms(tmp_path):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(CPU_KINETO))
    rc, _, out = refusal(f"report {path}")
    legend = out.split("definitions:\n", 1)[1]
    assert rc == 0 and legend.startswith("  torch.profiler CPU traces: ")
    assert "leaf spans that do arithmetic" not in out     # partui's own span terms
    # compute 40 of a 100 us window (aten::mm), comm 30 (gloo): bubble 60%
    row = out.splitlines()[1].split()
    assert row[:4] == ["0", "0.1", "0.04", "0.03"] and row[-1] == "60.0", row


@pytest.mark.parametrize("doc", [{"a": 1}, CPU_KINETO], ids=["any JSON", "torch.profiler"])
def test_whatif_on_a_json_that_is_no_partui_trace_is_refused_in_one_line(tmp_path, doc):
    path = tmp_path / "other.json"
    path.write_text(json.dumps(doc))
    rc, err, out = refusal(f"whatif {path} --link h800")
    assert rc == 2 and not out and len(err.strip().splitlines()) == 1
    assert f"{path}: not a partui trace" in err and "partui run --dp 2 --trace traces/run.json" in err


def test_report_on_an_op_table_points_to_blame(tmp_path):
    table = tmp_path / "ops.parquet"
    table.write_bytes(b"PAR1")
    rc, err, _ = refusal(f"report {table}")
    assert rc == 2 and f"is an op table, not a trace: partui blame reads tables (partui blame {table})" in err


def test_the_summary_says_which_steps_its_mean_holds():
    summary = {"world": 2, "steps": 5, "final_loss": 1.0, "mean_step_ms": 12.0}
    assert "mean step 12.0 ms (steps 1-4; step 0, the warm-up, left out)" in summary_text(summary, "dp 2")
    one = summary_text({**summary, "steps": 1}, "dp 2")
    assert "mean step 12.0 ms (step 0, the only one)" in one


def test_the_mean_step_is_the_mean_of_the_steps_after_the_first():
    proc = run_here("run", "--steps", 4, "--json", check_rc=0)
    steps = [ln["step_ms"] for ln in proc.lines if "step_ms" in ln]
    assert len(steps) == 4
    assert proc.lines[-1]["summary"]["mean_step_ms"] == pytest.approx(sum(steps[1:]) / 3)


def test_kinetos_own_log_lines_are_filtered_and_the_rest_kept(capfd):
    with without_kineto_log():
        os.write(2, b"USDT:2026 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
                    b"a rank's own warning\nSTAGE:2026 Completed Stage: Warm Up\n")
    assert capfd.readouterr().err == "a rank's own warning\n"


def test_the_tour_writes_only_ignored_paths():
    """Each path a Tour line writes (--trace, --profile, --plot) is one git ignores, so the Tour
    leaves the checkout clean (it profiled into an untracked prof/ before)."""
    written = []
    for cmd in tour_commands():
        words = shlex.split(cmd)
        written += [words[i + 1] for i, w in enumerate(words[:-1])
                    if w in ("--trace", "--profile", "--plot")]
    assert any(w.startswith("traces/prof") for w in written), written
    if not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    proc = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=ROOT,
                          capture_output=True, text=True)
    assert sorted(proc.stdout.split()) == sorted(written), (written, proc.stdout)
