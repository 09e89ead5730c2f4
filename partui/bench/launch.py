"""`partui bench launch`: seconds from nothing to a world whose ranks answer (target: 4 ranks
<= 3 s), against torch.multiprocessing.spawn of the same number of fresh processes."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from partui.bench.harness import print_rows
from partui.world.controller import Controller
from partui.world.launch import warm_up

_SPAWN_PEER = r"""
import sys, time, socket
t0 = time.perf_counter()
import torch, torch.multiprocessing as mp, torch.distributed as dist
def run(r, w, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=r, world_size=w)
    dist.barrier()
    dist.destroy_process_group()
if __name__ == "__main__":
    w = int(sys.argv[1]); s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(run, args=(w, port), nprocs=w)
"""


def _ours(world: int) -> float:
    """A fresh `python` that launches a world and sets up a tiny plan on it: the cold start."""
    code = ("import time; t0 = time.perf_counter()\n"
            "from partui.world.controller import Controller\n"
            f"w = Controller.launch({world}); w.close()\n"
            "print(time.perf_counter() - t0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return float(out.stdout.strip().splitlines()[-1])


def _warm(world: int) -> float:
    warm_up()
    Controller.launch(1).close()  # the fork server has finished importing torch
    t0 = time.perf_counter()
    Controller.launch(world).close()
    return time.perf_counter() - t0


def _spawn(world: int) -> float:
    """torch.multiprocessing.spawn needs an importable main: run the peer from a temp file."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(_SPAWN_PEER)
    try:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, f.name, str(world)], check=True, timeout=120,
                       capture_output=True)
        return time.perf_counter() - t0
    finally:
        os.unlink(f.name)


def main(argv) -> int:
    ap = argparse.ArgumentParser(prog="partui bench launch", description=__doc__)
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for w in map(int, args.worlds.split(",")):
        cold, spawn = _ours(w), _spawn(w)
        rows.append({"world": w, "partui_cold_s": cold, "partui_warm_s": _warm(w),
                     "mp_spawn_s": spawn, "ratio_cold": cold / spawn})
    print_rows(rows, ["world", "partui_cold_s", "partui_warm_s", "mp_spawn_s", "ratio_cold"],
               "time to a ready world (cold: new interpreter, fork server imports torch once; "
               "warm: fork server already up, as in the app after its first launch)", args.json)
    return 0
