"""`partui run` under torchrun: join the launcher's world instead of spawning one.

RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT come from torchrun; NCCL when CUDA is present
(each rank on cuda:LOCAL_RANK), gloo otherwise. Every rank runs the same commands a spawned rank
serves (partui.world.rank.handle: setup, step), so the rank's setup and step loop are written once;
their replies come to rank 0 by collectives instead of pipes, which makes the same step lines and
summary as a spawned world (partui.world.results) and hands them to the caller.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import torch

from kernels import comm
from partui.checkpoints.checkpoint import commit, manifest_of
from partui.world.controller import setup_payload
from partui.world.rank import handle, new_state
from partui.world.results import step_line, summarize
from partui.diagnosis.torchrun_watch import TorchrunWatch


def gather(obj, device: str) -> list:
    """Every rank's JSON-able obj, in rank order, on every rank (two all-gathers of bytes)."""
    data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8).to(device)
    n = comm.world_size()
    sizes = torch.zeros(n, dtype=torch.int64, device=device)
    comm.all_gather(sizes, torch.tensor([data.numel()], device=device), comm.world_group())
    width = int(sizes.max())
    padded = torch.zeros(width, dtype=torch.uint8, device=device)
    padded[:data.numel()] = data
    out = torch.empty(n * width, dtype=torch.uint8, device=device)
    comm.all_gather(out, padded, comm.world_group())
    rows = out.view(n, width).cpu()
    return [json.loads(bytes(rows[r, :int(sizes[r])].tolist())) for r in range(n)]


def torch_flight_recorder_on() -> str:
    """Turn torch's flight recorder on for this rank's process groups (the user's own settings
    kept) before the world is made; the prefix its dumps go under (TORCH_FR_DUMP_TEMP_FILE)."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE",
                          os.path.join(tempfile.gettempdir(), "partui_torch_fr_rank_"))
    return os.environ["TORCH_FR_DUMP_TEMP_FILE"]


def run_joined(world, steps: int, on_step=None, profile: str | None = None,
               resume: str | None = None, save: str | None = None,
               keep: int | None = None) -> dict | None:
    """Train `world`'s plan (a partui.World holding a validated plan and its training options) for
    `steps` on torchrun's world; on rank 0 calls on_step(line) per step and returns the summary
    (with backend and wall_s), elsewhere None. ValueError when the world sizes differ. profile: a
    folder each rank writes its torch.profiler file into (partui.recording.profile). resume: a checkpoint
    every rank loads first (checked by the caller); save: a save root every rank writes into at
    the end (a folder all nodes share), committed by rank 0 once every rank has written."""
    plan, cfg = world.current_plan, world.cfg
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if plan.world != size:
        raise ValueError(f"the plan needs {plan.world} ranks but torchrun started {size}: pass "
                         f"--nproc-per-node {plan.world} (x nodes) or change the dims")
    backend = comm.default_backend()
    device = "cpu"
    if backend == "nccl":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    t0 = time.perf_counter()
    prefix = torch_flight_recorder_on()
    comm.init(backend, rank, size, init_method="env://", timeout_s=world.timeout_s)
    watch = TorchrunWatch(rank, size, prefix, world.flight_dump).start()   # a hang: named in < 10 s
    if rank == 0:                 # once the world exists: a failed rendezvous stays one line
        print(f"partui run: torch's flight recorder is on ({os.environ['TORCH_FR_BUFFER_SIZE']} "
              f"entries a rank): dumps go to {prefix}<rank> (NCCL's watchdog on a timeout; every "
              f"rank when a step fails); read them with partui doctor {prefix}", file=sys.stderr,
              flush=True)
    try:
        state = new_state(rank)
        payload = setup_payload(plan, cfg, device=device, **world.training())
        infos = gather(handle(state, "setup", payload), device)
        if resume:
            handle(state, "load", {"path": os.path.abspath(resume)})
        launch_s, t1 = time.perf_counter() - t0, time.perf_counter()
        if profile:
            handle(state, "profile_start", {"dir": profile})
        lines = []
        for _ in range(steps):
            try:
                item = handle(state, "step", {"n": 1})[0]
            except BaseException as e:    # every rank's records and both verdicts, then the error
                watch.failed(e)
                raise
            items = gather(item, device)
            if rank == 0:
                lines.append(step_line(items))
                if on_step is not None:
                    on_step(lines[-1])
        if profile:
            handle(state, "profile_stop", {})
        if save:
            save_joined(world, state, save, keep)
        watch.finish()                    # its records kept, should another rank still hang
        if world.fault and rank == 0:     # a run that survived its fault: both recorders' verdicts
            watch.gather_and_print(f"end of run with --fault {world.fault}")
        watch.close()
    finally:
        comm.destroy()
    if rank != 0:
        return None
    out = summarize(plan, cfg, infos, lines, launch_s)
    out.update(backend=backend, wall_s=time.perf_counter() - t1)
    return out


def save_joined(world, state: dict, root: str, keep: int | None) -> str:
    """Every rank writes into one partial folder (named by the step, so all agree on it without a
    message), then rank 0 commits it (partui.checkpoints.checkpoint) after a barrier."""
    step = state["engine"].step_count
    tmp = os.path.join(os.path.abspath(root), f".partial-torchrun-{step}")
    os.makedirs(tmp, exist_ok=True)
    handle(state, "save", {"path": tmp})
    comm.barrier()
    final = ""
    if comm.world_rank() == 0:
        final = commit(tmp, root, manifest_of(step, world.current_plan, world.cfg, world.model,
                                              world.training()), keep)
        print(f"partui run: checkpoint {final}", file=sys.stderr, flush=True)
    comm.barrier()
    return final
