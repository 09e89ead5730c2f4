"""`partui run` under torchrun: join the launcher's world instead of spawning one.

RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT come from torchrun; NCCL when CUDA is present
(each rank on cuda:LOCAL_RANK), gloo otherwise. Rank 0 prints the step lines.
"""
from __future__ import annotations

import json
import os
import time


def run_joined(args, plan, cfg) -> int:
    import torch
    from kernels import comm
    from kernels.engine import Engine
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if plan.world != world:
        print(f"partui run: the plan needs {plan.world} ranks but torchrun started {world}: "
              f"pass --nproc-per-node {plan.world} (x nodes) or change the dims", flush=True)
        return 2
    if args.check or args.trace:
        if rank == 0:
            print("partui run: --check and --trace gather every rank's pieces through partui's own "
                  "controller; run them without torchrun (partui run --check ...)", flush=True)
        return 2
    backend = comm.default_backend()
    device = "cpu"
    if backend == "nccl":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    comm.init(backend, rank, world, init_method="env://", timeout_s=args.timeout)
    try:
        eng = Engine(plan, cfg, rank=rank, seed=args.seed, optim=args.optim, lr=args.lr,
                     backward=args.backward, weight_decay=args.weight_decay, device=device)
        t0 = time.perf_counter()
        losses = []
        for _ in range(args.steps):
            res = eng.step()
            losses.append(res.loss)
            if rank == 0:
                line = {"step": res.step, "loss": res.loss, "step_ms": res.step_ms}
                print(json.dumps(line) if args.json else
                      f"step {res.step:4d}  loss {res.loss:.4f}  {res.step_ms:8.1f} ms", flush=True)
        if rank == 0 and args.json:
            print(json.dumps({"summary": {"plan": plan.to_dict(), "world": world,
                                          "backend": backend, "steps": len(losses),
                                          "final_loss": losses[-1] if losses else None,
                                          "wall_s": time.perf_counter() - t0}}), flush=True)
    finally:
        comm.destroy()
    return 0
