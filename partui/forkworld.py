"""A gloo world of forked rank processes, for benches and tests.

`run_world(size, fn, *args)` forks `size` ranks, initialises gloo in each (127.0.0.1, rank 0
serves the rendezvous store on a port the OS picks), runs fn(rank, size, *args) with one torch
thread and returns the results in rank order. A rank's exception comes back as a RuntimeError
carrying its traceback; a rank that dies or a world that runs past timeout_s raises too, and
the rank processes left are killed.

The fork start method means fn and args need no pickling (closures and lambdas work), but the
parent must not hold a gloo world of its own: forked ranks would inherit its sockets.
"""
from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from multiprocessing.connection import wait as mp_wait

import torch

from kernels import comm


def _rank_main(rank: int, size: int, conn, fn, args, timeout_s: float) -> None:
    try:
        torch.set_num_threads(1)                       # ranks share the machine's few cores
        if rank == 0:
            store, port = comm.store_server(size, timeout_s)
            conn.send(("port", port))
        else:
            store = comm.store_client(conn.recv()[1], size, timeout_s)
        comm.init("gloo", rank, size, store=store, timeout_s=timeout_s)
        result = fn(rank, size, *args)
        comm.barrier()                                 # rank 0's store lives until all are done
        conn.send(("ok", result))
        comm.destroy()
    except BaseException as e:  # noqa: BLE001 - every failure goes to the parent
        conn.send(("error", f"rank {rank}: {type(e).__name__}: {e}\n{traceback.format_exc()}"))


MORE_TIME = "allow more time (timeout_s, or a bench's --timeout) or give it less work"


def run_world(size: int, fn, *args, timeout_s: float = 120.0, what: str = "world",
              fix: str = MORE_TIME) -> list:
    """fn(rank, size, *args) on `size` forked gloo ranks; their results in rank order.

    `what` names the world in errors ("cp 4 world"); `fix` is what a timeout error suggests."""
    if size < 1:
        raise ValueError(f"run_world: size {size}: a world needs 1 rank or more")
    if comm.is_initialized():
        raise RuntimeError(f"run_world ({what}): this process already holds a gloo world, which "
                           f"forked ranks would inherit: call comm.destroy() first")
    ctx = mp.get_context("fork")
    procs, conns, finished = [], [], False
    try:
        for r in range(size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_rank_main, args=(r, size, child, fn, args, timeout_s),
                            daemon=True)
            p.start()
            child.close()
            procs.append(p)
            conns.append(parent)
        deadline = time.monotonic() + timeout_s
        port = _gather({0: (conns[0], procs[0])}, deadline, timeout_s, what, fix)[0]
        for c in conns[1:]:
            c.send(("port", port))
        results = _gather(dict(enumerate(zip(conns, procs))), deadline, timeout_s, what, fix)
        finished = True
        return [results[r] for r in range(size)]
    finally:
        for p in procs:
            p.join(2.0 if finished else 0.0)         # after a failure the rest only hang
            if p.is_alive():
                p.kill()
                p.join(1.0)
        for c in conns:
            c.close()


def _gather(pending: dict, deadline: float, timeout_s: float, what: str, fix: str) -> dict:
    """One message from each rank in pending {rank: (conn, proc)}, whichever answers first, so a
    failing rank is reported at once rather than after its peers time out waiting for it."""
    pending, out = dict(pending), {}
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the {what} did not finish within {timeout_s:g} s (rank(s) "
                               f"{sorted(pending)} gave no result): {fix}")
        waitables = [c for c, _ in pending.values()] + [p.sentinel for _, p in pending.values()]
        ready = set(mp_wait(waitables, timeout=left))
        for rank, (conn, proc) in list(pending.items()):
            if conn in ready:
                try:
                    kind, body = conn.recv()
                except EOFError:
                    raise RuntimeError(f"{what}: rank {rank} (pid {proc.pid}) closed its pipe "
                                       f"without a result") from None
                if kind == "error":
                    raise RuntimeError(f"{what}: {body}")
                out[rank] = body
                del pending[rank]
            elif proc.sentinel in ready and not conn.poll(0):
                proc.join(1.0)                         # the sentinel can close before exit
                raise RuntimeError(f"{what}: rank {rank} (pid {proc.pid}) died (exit code "
                                   f"{proc.exitcode}) without a result")
    return out
