"""Holding ops to an emulated link: every op still moves its bytes through gloo (results stay
exact), but its completion is held until the time the link model (planning/link.py) gives.

When an op is done, and which ops pair up across ranks, are the link's rules (planning.link:
match_key, Ports, share_port), the same ones the what-if replay applies to a trace.
Waiting for a held op sleeps (time.sleep to the deadline, with the thread's timer slack at 1 ns
so it wakes on time), never spins.

Ranks publish through a small shared-memory table (one file mapped by every rank of the world, on
one host; CLOCK_MONOTONIC is shared there): slot = hash(op key, writer, sequence number) holds
(check, nanoseconds). Collectives are matched by (group, n-th op on it), p2p by (src, dst, tag,
n-th message). A slot overwritten by a collision fails its check and falls back to the local time.
"""
from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import tempfile
import threading
import time

import torch.distributed as dist

from kernels.comm import events
from planning.link import LinkModel, Ports, match_key

SLOTS = 1 << 16                    # entries of (check, ns): 1 MiB, ops in flight are far fewer
_lock = threading.Lock()
_state: dict = {}                  # model, table, seq {key: n}, ports (this rank's), rank
_timers = threading.local()        # .set: this thread's timer slack is already 1 ns
PR_SET_TIMERSLACK = 29             # linux/prctl.h


class Hold:
    """An op's place on the emulated link; `end` (ns) once settled."""
    __slots__ = ("kind", "key", "seq", "ranks", "latency_ns", "transfer_ns", "port", "end")

    def __init__(self, kind, key, seq, ranks, latency_ns, transfer_ns, port):
        self.kind, self.key, self.seq, self.ranks = kind, key, seq, ranks
        self.latency_ns, self.transfer_ns, self.port, self.end = latency_ns, transfer_ns, port, None


def model() -> LinkModel | None:
    return _state.get("model")


def set_link(link: LinkModel | None) -> None:
    """Install (None: remove) the emulated link on this rank. Collective over the world when one is
    initialised: rank 0 makes the shared table and every rank maps it. Call it between steps."""
    with _lock:
        _state.clear()
    if link is None:
        return
    table = _shared_table() if dist.is_available() and dist.is_initialized() else \
        memoryview(bytearray(SLOTS * 16)).cast("q")
    with _lock:
        _state.update(model=link, table=table, seq={}, ports=Ports(),
                      rank=dist.get_rank() if dist.is_initialized() else 0)


def _shared_table():
    path = [None]
    if dist.get_rank() == 0:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path[0] = tempfile.mkstemp(prefix="partui-link-", dir=folder)
        os.ftruncate(fd, SLOTS * 16)
        os.close(fd)
    dist.broadcast_object_list(path, src=0)
    with open(path[0], "r+b") as f:
        mm = mmap.mmap(f.fileno(), SLOTS * 16)
    dist.barrier()
    if dist.get_rank() == 0:
        os.unlink(path[0])        # every rank has it mapped; the memory lives until they unmap
    return memoryview(mm).cast("q")


def _slot(key: tuple, writer, seq: int) -> tuple[int, int]:
    h = int.from_bytes(hashlib.blake2b(repr((key, writer, seq)).encode(), digest_size=8).digest(),
                       "little")
    return 2 * (h % SLOTS), (h >> 1) | 1          # index of (check, ns); check never 0


def _publish(key, writer, seq, ns) -> None:
    i, check = _slot(key, writer, seq)
    table = _state["table"]
    table[i + 1] = ns
    table[i] = check


def _read(key, writer, seq) -> int | None:
    i, check = _slot(key, writer, seq)
    table = _state["table"]
    return table[i + 1] if table[i] == check else None


def on_issue(op: str, group_name: str, ranks: list[int], nbytes: int, peer: int | None,
             tag: int, t_issue: int) -> Hold | None:
    """Place an op just issued on the link (None: no link, or nothing to move)."""
    link = _state.get("model")
    if link is None or len(ranks) <= 1:
        return None
    me = _state["rank"]
    key, kind, ranks = match_key(op, me, peer, tag, group_name, ranks)
    latency, transfer = link.cost(op, ranks, nbytes)
    port = link.port(ranks)
    with _lock:
        seq = _state["seq"].get((key, kind), 0)
        _state["seq"][key, kind] = seq + 1
        hold = Hold(kind, key, seq, ranks, int(latency * 1e9), int(transfer * 1e9), port)
        if kind == "coll":
            _publish(key, me, seq, t_issue)
        elif kind == "send":                       # eager: its end is known now; the peer reads it
            _publish(key, "send", seq, _queue(hold, t_issue))
    return hold


def _queue(hold: Hold, start: int) -> int:
    """The link's port rule (planning.link.Ports); the caller holds _lock."""
    hold.end = _state["ports"].queue(hold.port, start, hold.latency_ns, hold.transfer_ns)
    return hold.end


def completion(hold: Hold | None, t_issue: int, t_real: int | None) -> int | None:
    """The modelled completion of an op (ns); t_real: when gloo finished it, if known. Without a
    link, t_real itself."""
    if hold is None:
        return t_real
    with _lock:
        if hold.end is None and "ports" not in _state:     # the link was removed since the issue
            hold.end = t_real if t_real is not None else t_issue
        if hold.end is None:
            if hold.kind == "recv":
                sent = _read(hold.key, "send", hold.seq)
                hold.end = max(t_issue, sent if sent is not None else t_issue + hold.latency_ns
                               + hold.transfer_ns)
            else:
                seen = [_read(hold.key, r, hold.seq) for r in hold.ranks]
                _queue(hold, max([t for t in seen if t is not None] + [t_issue]))
        return max(hold.end, t_real) if t_real is not None else hold.end


def _precise_timers() -> None:
    """Ask Linux to wake this thread's sleeps on time: its default timer slack (50 us) lets the
    kernel batch wake-ups that late, and a step holds dozens of ops (measured here: a 2 ms sleep
    woke 145 us late at the median with the default, 77 us with 1 ns). Per thread, once."""
    if getattr(_timers, "set", False):
        return
    _timers.set = True
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):                 # not Linux: the default slack stays
        pass


def sleep_until(t_ns: int) -> None:
    """Block until the monotonic clock reaches t_ns, sleeping (never spinning on a core): one
    sleep to the deadline, again only if woken early."""
    _precise_timers()
    while (left := t_ns - events.now_ns()) > 0:
        time.sleep(left / 1e9)
