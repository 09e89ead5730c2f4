"""The rendezvous store of partui's own worlds, on loopback only (gloo follows it there:
kernels.comm.core.init sets GLOO_SOCKET_IFNAME=lo when given a store), and torch's own flight
recorder dumped as torch writes it (partui run under torchrun; partui doctor reads it)."""
from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

LOOPBACK = "127.0.0.1"   # where partui's own worlds listen: the store and gloo (GLOO_SOCKET_IFNAME=lo)


def store_server(world_size: int, timeout_s: float = 30.0):
    """(store, port): a rendezvous store on 127.0.0.1 only, port picked by the OS. TCPStore given a
    host still binds every interface, so the loopback socket is made here and handed over."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, 0))
        sock.listen(128)
        port = sock.getsockname()[1]
        store = dist.TCPStore(LOOPBACK, port, world_size, is_master=True,
                              timeout=datetime.timedelta(seconds=timeout_s),
                              wait_for_workers=False, master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()                      # the store owns the fd now: Python must not close it too
    return store, port


def store_client(port: int, world_size: int, timeout_s: float = 30.0):
    return dist.TCPStore(LOOPBACK, port, world_size, is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def dump_torch_flight_recorder(path: str) -> bool:
    """torch's own flight recorder (TORCH_FR_BUFFER_SIZE) of this rank, pickled to path as torch
    writes it on a watchdog timeout; False when torch keeps none. Written whole or not at all."""
    try:
        data = torch._C._distributed_c10d._dump_fr_trace(includeCollectives=True,
                                                         includeStackTraces=False,
                                                         onlyActive=False)
    except (AttributeError, RuntimeError):
        return False
    tmp = f"{path}.partial-{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return True


def launcher_store(prefix: str, timeout_s: float = 10.0):
    """A client of the launcher's store (torchrun's, at MASTER_ADDR:MASTER_PORT) under prefix: a
    side channel between ranks that still works while a collective blocks their main threads
    (partui/diagnosis/torchrun_watch.py). Its own connection: gloo's use of the store is not disturbed."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.PrefixStore(prefix, store)
