"""A stopped rank (SIGSTOP: alive, silent) is named within 15 s by its silent heartbeat, in
partui.World and on the CLI, and the world is torn down with no process left (a stopped process
still dies to SIGKILL)."""
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from partui.world.world import World
from partui.world.launch import RankStalled


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone(pids, within_s=10.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _grandchildren(pid: int) -> list[int]:
    parent = {}
    for d in os.listdir("/proc"):
        try:
            parent[int(d)] = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
    kids = {c for c, pp in parent.items() if pp == pid}
    return sorted(c for c, pp in parent.items() if pp in kids)


def test_a_stopped_rank_is_named_within_15_s_and_the_world_torn_down():
    w = World(timeout_s=120)
    w.plan("dp", dp=4, layers=1)
    w.launch()
    try:
        w.step(1)
        pids = w.pids()
        os.kill(pids[2], signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(RankStalled) as e:
            w.run(200)
        named_s = time.monotonic() - t0
    finally:
        w.close()
    assert e.value.rank == 2 and "rank 2: stopped making progress" in str(e.value)
    assert named_s < 15, f"named after {named_s:.1f} s"
    assert _gone(pids), "rank processes outlived the stalled world"


def test_the_cli_names_the_stopped_rank():
    p = subprocess.Popen([sys.executable, "-m", "partui", "run", "--dp", "4", "--layers", "1",
                          "--steps", "200", "--timeout", "60"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout.readline().startswith("step")
        ranks = _grandchildren(p.pid)              # the fork server's children: the ranks
        assert len(ranks) == 4, ranks
        t0 = time.monotonic()
        os.kill(ranks[-1], signal.SIGSTOP)
        _, err = p.communicate(timeout=40)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 1 and "stopped making progress" in err, err
    assert took < 20, f"{took:.1f} s from SIGSTOP to exit"
