"""`partui run --save DIR --save-every 1` whose rank is SIGKILLed: exit 1, and the last line names
the last good checkpoint and the command that resumes it; that checkpoint resumes, numbered on."""
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, run_here
from partui.checkpoints.checkpoint import saved_steps


def rank_pids(pid: int) -> list[int]:
    """The ranks of `partui run` process `pid`: its fork server's children (from /proc)."""
    parent = {}
    for d in os.listdir("/proc"):
        try:
            parent[int(d)] = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
    kids = {c for c, pp in parent.items() if pp == pid}
    return sorted(c for c, pp in parent.items() if pp in kids)


@pytest.mark.timeout(300)
def test_a_dead_rank_names_the_last_checkpoint_and_the_resume_command(tmp_path):
    root = str(tmp_path / "ckpt")
    p = subprocess.Popen([sys.executable, "-m", "partui", "run", "--dp", "2", "--layers", "1",
                          "--steps", "400", "--save", root, "--save-every", "1", "--keep", "2",
                          "--timeout", "60"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(saved_steps(root)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        ranks = rank_pids(p.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 1, err
    hint = err.strip().splitlines()[-1]
    m = re.search(r"last checkpoint (\S+); resume with: partui (.*)$", hint)
    assert m, hint
    last, command = m.group(1), shlex.split(m.group(2))
    assert last in saved_steps(root) and command[-2:] == ["--resume", last]
    step = int(last.rsplit("-", 1)[1])
    steps_at = command.index("--steps")
    command[steps_at + 1] = "1"
    res = run_here(*command, "--json", check_rc=0)
    assert res.lines[0]["step"] == step
