"""Every bad input a new user tried exits 2 with one line naming the problem and a fix that is itself
valid, before any process starts; `partui report` refuses broken traces the same way; Ctrl-C prints
one line, exits 130 and leaves no process. BAD_INPUTS is the count of issue 28: each runs in this
process through partui.cli.main (they all fail before a world starts, so no subprocess is needed)."""
import contextlib
import gzip
import io
import shlex
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, run_cli, run_here
from partui.cli import main
from partui.commands.run import cap_trace_steps, trace_size_warning

FLAG = re.compile(r"--([a-z-]+)(?: (-?[\w.]+))?")

RUN_BAD = [  # (flags, words the one line must hold)
    (["--steps", "0"], "--steps 5"),
    (["--steps", "-1"], "--steps 5"),
    (["--steps", "0", "--check"], "--steps 5"),
    (["--world", "-1"], "pick world in 1, 2, 4, 8"),
    (["--world", "-4", "--tp", "2"], "pick world in 2, 4, 8, 16"),
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


SAMPLE = "traces/sample-dualpipev-ep.json.gz"
BAD_INPUTS = [  # (argv, words the message must hold): each refused before anything launches
    ('run --dp 0', 'data-parallel ranks are 1 or more'),
    ('plan --dp 0', 'data-parallel ranks are 1 or more'),
    ('run --dp -2', 'pick dp in 1, 2, 4, 8'),
    ('run --lr -1', 'the learning rate must be > 0 (and finite); try --lr 1e-3'),
    ('run --lr 0', 'the learning rate must be > 0 (and finite); try --lr 1e-3'),
    ('run --lr nan', 'the learning rate must be > 0 (and finite); try --lr 1e-3'),
    ('run --weight-decay -5', 'weight decay must be >= 0'),
    ('run --weight-decay inf', 'weight decay must be >= 0'),
    ('run --steps 0', 'a run takes 1 step or more; try --steps 5'),
    ('run --steps -3', 'a run takes 1 step or more; try --steps 5'),
    ('run --timeout 0', 'seconds any command may take must be > 0; try --timeout 120'),
    ('run --timeout -1', 'seconds any command may take must be > 0; try --timeout 120'),
    ('run --timeout nan', 'seconds any command may take must be > 0; try --timeout 120'),
    ('run --tp 3', 'pick tp in 1, 2, 4'),
    ('plan --tp 100000', 'pick tp in 1, 2, 4'),
    ('plan --tp 0', 'pick tp in 1, 2, 4'),
    ('plan --tp -1', 'pick tp in 1, 2, 4'),
    ('plan --cp 0', 'pick cp in 1, 2, 4, 8, 16'),
    ('plan --pp 0', 'pick pp in 1, 2, 4'),   # the Plan's microbatches follow pp
    ('plan --pp -2', 'pick pp in 1, 2, 4'),
    ('plan --world -1', 'pick world in 1, 2, 4, 8'),
    ('plan --world 3 --tp 2', 'set --world 2 or --world 4 or --tp 1 and no --world'),
    ('plan --world 6 --dp 2', 'set --world 2'),
    ('plan --zero 4', 'set --zero 0'),
    ('plan --zero 2', 'set --dp 2 or --dp 4 or --zero 0'),
    ('plan --zero -1', 'set --zero 0'),
    ('plan --grad-sync fast', 'pick --grad-sync in naive, bucketed'),
    ('plan --bucket-mb 0', 'set --bucket-mb 4.0'),
    ('plan --bucket-mb -1', 'pick --bucket-mb in 1.0, 4.0'),
    ('plan --sp', 'set --tp 2 or --tp 4 or no --sp'),
    ('plan --tp 2 --sp --seq 33', 'set --seq 34 or no --sp'),
    ('plan --cp 3', 'set --seq 33'),
    ('plan --cp 2 --cp-mode ulysses --heads 1 --kv-heads 1 --dim 64', 'set --cp-mode ring'),
    ('plan --cp-mode star --cp 2', 'pick --cp-mode in ring, zigzag, ulysses'),
    ('plan --cp 2 --experts 4', 'set --cp 1 or --experts 0'),
    ('plan --pp 3', 'set --layers 6 or --pp 2'),
    ('plan --pp 100000', 'pp 100000 must be <= 1024: pick pp in 1, 2, 4'),
    ('plan --pp 4 --layers 2', 'set --layers 4 or --pp 2'),
    ('plan --pp 2 --schedule nope', 'pick schedule in gpipe, 1f1b, zb1p'),
    ('plan --pp 2 --microbatches -1', 'microbatches -1 must be >= 0: set --microbatches 0'),
    ('plan --pp 2 --microbatches 3', 'set --microbatches 2 or --microbatches 4'),
    ('plan --pp 2 --microbatches 1', '1f1b needs microbatches >= pp = 2'),
    ('plan --pp 3 --schedule dualpipe --layers 6', 'set --schedule dualpipev or --pp 2'),
    ('plan --pp 2 --schedule dualpipe --microbatches 3', 'pick microbatches in 4, 8'),
    ('plan --pp 2 --schedule interleaved --microbatches 3', 'pick microbatches in 2, 4, 8'),
    ('plan --pp 2 --schedule interleaved --virtual-stages 1', 'set --virtual-stages 2'),
    ('plan --pp 2 --virtual-stages 2', 'set --virtual-stages 1 or --schedule interleaved'),
    ('plan --pp 2 --schedule zb1p --zero 3 --dp 2', 'set --zero 2 or --schedule 1f1b'),
    ('plan --fb-overlap', 'set no --fb-overlap'),
    ('plan --pp 2 --fb-overlap', 'set --experts 4 or --experts 4 --ep 2 or no --fb-overlap'),
    ('plan --pp 2 --schedule gpipe --fb-overlap --experts 4', 'or no --fb-overlap'),
    ('plan --ep 2', 'set --experts 4 or --experts 2 or --ep 1'),
    ('plan --ep 3 --experts 4', 'set --ep 2 --dp 2 or --ep 4 --dp 4'),
    ('plan --ep 0 --experts 4', 'pick ep in 1, 2, 4'),
    ('plan --experts -4', 'pick experts in 0, 4'),
    ('plan --experts 4 --top-k 5', 'pick --top-k in 1, 2, 3, 4'),
    ('plan --experts 4 --top-k 0', 'pick --top-k in 1, 2, 3, 4'),
    ('plan --overlap', 'set --experts 4 or no --overlap'),
    ('plan --overlap --experts 4 --batch 3', 'set --batch 2 or no --overlap'),
    ('plan --experts 4 --capacity-factor 0', 'set --capacity-factor 1.0 or no --capacity-factor'),
    ('plan --experts 4 --capacity-factor -1', 'set --capacity-factor 1.0 or no --capacity-factor'),
    ('plan --experts 4 --ep-dispatch odd', 'pick --ep-dispatch in uneven, even'),
    ('plan --experts 4 --sp --tp 2', 'set no --sp or --experts 0'),
    ('plan --moe nope --experts 4', 'pick moe in gshard, deepseek'),
    ('plan --dtype fp16', 'pick dtype in fp32, bf16'),
    ('plan --collectives magic', 'pick collectives in native, hand'),
    ('plan --batch 7 --dp 2', 'set --batch 8 or --dp 7'),
    ('plan --batch 0', 'model batch = 0 must be >= 1'),
    ('plan --heads 3', 'pick dim a multiple of heads'),
    ('plan --kv-heads 3', 'kv heads must divide heads'),
    ('plan --layers 0', 'model layers = 0 must be >= 1'),
    ('plan --dim 0', 'model dim = 0 must be >= 1'),
    ('plan --seq 0', 'model seq = 0 must be >= 1'),
    ('plan --vocab 0', 'model vocab = 0 must be >= 1'),
    ('plan --vocab 255 --tp 2', 'set --vocab 256 or --vocab 256 --hidden 192 or --tp 1'),
    ('plan --hidden 10 --tp 4', 'set --hidden 64 or --tp 1 or --tp 2'),
    ('plan --model huge', 'pick one of tiny, small, medium, large, deepseek-tiny'),
    ('plan --tp x', "invalid int value: 'x'"),
    ('plan --microbatches 100000', 'pick microbatches in 1, 2, 4, 8'),
    ('plan --batch 1000000007 --dp 3', 'set --batch 1000000008'),
    ('run --trace /proc/partui.json', 'folder /proc cannot be written'),
    ('run --trace traces', 'name a file in it, e.g. --trace traces/run.json'),
    ('run --trace nope/dir/x.json', 'does not exist; create it or pick another path'),
    ('run --trace traces/x.txt', 'name it .json or .json.gz'),
    ('run --trace traces/t.json --trace-steps 3:2', 'pick START < STOP <= 5'),
    ('run --trace traces/t.json --trace-steps a:b', "--trace-steps 'a:b' is not START:STOP (e.g. 2:4)"),
    ('run --trace traces/t.json --trace-steps 0:99', 'pick START < STOP <= 5'),
    ('run --optim lion', "'lion' (choose from 'adamw', 'sgd')"),
    ('run --backward magic', "'magic' (choose from 'hand', 'autograd')"),
    ('run --backward autograd --pp 2', 'drop --backward autograd (or those dims)'),
    ('run --reference magic', "'magic' (choose from 'hand', 'autograd')"),
    ('run --link warp', 'is not a preset or a spec'),
    ('run --link alpha_us=-1,gbps=1', 'alpha_us must be a finite number >= 0 and gbps a finite number > 0'),
    ('run --link alpha_us=inf,gbps=1', 'alpha_us must be a finite number >= 0'),
    ('bench step --rounds 0', 'argument --rounds: 0 must be >= 1'),
    ('simulate --schedule 1f1b --pp 100000 --microbatches 100000', '--pp 100000: pp 100000 must be <= 1024'),
    ('simulate --schedule 1f1b --pp 1000 --microbatches 65536', 'actions to simulate (at most 2,000,000'),
    ('simulate --schedule 1f1b --pp 2 --microbatches 0', '--microbatches 0: microbatches 0 must be >= 1; e.g. --microbatches 1'),
    ('report traces/sample-dualpipev-ep.json.gz --plot traces', '--plot traces is a folder: name a file in it'),
    ('report traces/sample-dualpipev-ep.json.gz --memory --plot traces/x', '--plot traces/x: name it .png'),
    ('blame traces/sample-dualpipev-ep.json.gz --critical-path /nonexistent-dir/m.json',
     'folder /nonexistent-dir does not exist'),
    ('blame traces/sample-dualpipev-ep.json.gz --critical-path traces', '--critical-path traces is a folder'),
    ('bench step --models huge', 'unknown model preset(s) huge: pick from tiny'),
    ('bench pp --rounds -1', 'argument --rounds: -1 must be >= 1'),
    ('run --dp 2 --experts 4 --ep 2 --capacity-factor nan', 'capacity factor nan is not a finite number'),
    ('run --dp 2 --experts 4 --ep 2 --capacity-factor inf', 'capacity factor inf is not a finite number'),
    ('run --dp 2 --bucket-mb nan', 'bucket size nan is not a finite number: set --bucket-mb 4.0'),
    ('run --model deepseek-tiny --route-scale nan', '--route-scale nan is not a finite number: set --route-scale 1'),
    ('simulate --schedule 1f1b --pp 2 --microbatches 4 --cost F=nan', 'cost F=nan must be a finite number'),
    ('run --ranks-per-node 0 --link h100 --dp 2', 'ranks on one node are 1 or more'),
    ('run --foo', 'error: unrecognized arguments: --foo'),
    ('plan --foo', 'error: unrecognized arguments: --foo'),
    ('report', 'error: the following arguments are required: trace'),
    ('report nothing.json', 'no such file or directory'),
    ('report {S} --by nope', "invalid choice: 'nope'"),
    ('report {S} --format xml', "'xml' (choose from 'table', 'csv', 'json', 'markdown')"),
    ('report nothing.json --plot /no/such/dir/x.png', 'folder /no/such/dir does not exist'),
    ('report {S} --routing --by step', 'drop --vs, --plot and --by'),
    ('simulate --schedule nope --pp 2 --microbatches 4', "unknown schedule 'nope': pick one of"),
    ('simulate --schedule dualpipe --pp 3 --microbatches 8', 'use pp=4 or schedule=dualpipev (any pp)'),
    ('simulate --schedule 1f1b --pp 2 --microbatches 8 --cost F=1,Q=2', "bad cost item 'Q=2'"),
    ('simulate --schedule 1f1b --pp 2 --microbatches 8 --cost B=1,W=2', 'e.g. B=2,W=1'),
    ('simulate --schedule 1f1b --pp 0 --microbatches 4', '--pp 0: pp 0 must be >= 1; e.g. --pp 1'),
    ('simulate --schedule 1f1b --pp 2', '--microbatches'),
    ('whatif nothing.json', '--link h800 (or alpha_us=A,gbps=B)'),
    ('whatif {S} --link warp', 'is not a preset or a spec'),
    ('bench nope', "invalid choice: 'nope'"),
    ('nope', "invalid choice: 'nope'"),
    ('whatif {S} --link h800 --compute-scale -1', '--compute-scale -1.0 must be a finite number > 0'),
    ('whatif {S} --link h800 --pp 0', '--pp 0 must be >= 1'),
    ('whatif {S} --link h800 --microbatches 3', 'set --microbatches 4'),
    ('whatif nothing.json --link h800', 'no such file or directory'),
    ('report {S} --vs nothing.json', 'no such file or directory'),
    ('run --dtype bf16 --check --reference autograd', 'drop --reference autograd or set --dtype fp32'),
    ('run --trace traces/t.json --trace-steps 2:2', 'pick START < STOP <= 5'),
    ('plan --batch 100000 --dim 100000', 'needs an estimated 108290.1 GiB'),
    ('run --batch 100000 --dim 100000', 'this machine has available (MemAvailable): try --dim 8'),
    ('plan --layers 100000 --dim 4096', 'try --layers 6'),
]


@pytest.mark.parametrize("argv,words", BAD_INPUTS, ids=[a for a, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_a_message_and_no_traceback(argv, words, monkeypatch):
    monkeypatch.chdir(ROOT)                     # the table's paths are the repository's
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(shlex.split(argv.replace("{S}", SAMPLE)))
        except SystemExit as e:                 # argparse's own refusals
            rc = e.code
    text = err.getvalue()
    assert rc == 2, (rc, text, out.getvalue()[-500:])
    last = text.strip().splitlines()[-1]
    assert last.startswith("partui"), text      # `partui CMD: ...`: the command is named
    assert words in last, last
    assert "Traceback" not in text and not out.getvalue(), text


def test_the_bad_input_list_is_at_least_80_long_and_has_no_repeats():
    argvs = [a for a, _ in BAD_INPUTS]
    assert len(argvs) >= 80 and len(set(argvs)) == len(argvs)


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
            ok = run_here("run", *fixed, "--steps", 1)
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
    proc = run_here("run", "--dp", world, "--batch", world, "--steps", 1, "--layers", 1)
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


def interrupt_after(args: list, lines: int):
    """`partui run ARGS` with Ctrl-C (SIGINT to its process group, as a terminal sends it) after
    `lines` step lines: the finished process."""
    p = subprocess.Popen([sys.executable, "-m", "partui", "run", *map(str, args)], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        for _ in range(lines):
            assert p.stdout.readline().startswith("step"), "the run stopped early"
        os.killpg(p.pid, signal.SIGINT)
        _, p.err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    return p


def test_ctrl_c_prints_one_line_exits_130_and_leaves_no_process():
    p = interrupt_after(["--dp", 2, "--steps", 300], 1)
    assert p.returncode == 130
    assert p.err.strip().splitlines() == ["partui run: interrupted"], p.err
    deadline = time.monotonic() + 10
    while _session_pids(p.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _session_pids(p.pid), "rank or helper processes outlived the run"


def test_ctrl_c_in_a_traced_run_keeps_the_steps_done_in_the_partial_file(tmp_path):
    asked = tmp_path / "run.json"
    p = interrupt_after(["--dp", 2, "--layers", 1, "--steps", 45, "--trace", asked], 3)  # < 50 cap
    partial = tmp_path / "run.partial.json"
    assert p.returncode == 130 and not asked.exists(), p.err
    assert f"are in {partial}; {asked} was not written" in p.err and "Traceback" not in p.err, p.err
    assert p.err.strip().splitlines()[-1] == "partui run: interrupted"
    first, last = json.loads(partial.read_text())["metadata"]["steps"]
    assert first == 0 and last >= 2


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
    proc = run_here("run", "--dp", 2, "--layers", 1, "--steps", 55, "--trace", out)
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
    quiet = run_here("run", "--layers", 1, "--steps", 3, "--trace", tmp_path / "short.json")
    assert quiet.returncode == 0 and "warning" not in quiet.stderr
