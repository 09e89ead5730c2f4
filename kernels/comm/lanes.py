"""Where hand collectives run: one lane (worker thread) per process group, per-op peers, tags, segments.

An op is submitted to its group's lane, which runs the group's hand ops one after another in
issue order, like a NCCL stream; the op's Handle completes, in that thread, the moment the data
is in place. The op is recorded once (one OpLog record, args impl="hand"); each of its p2p steps
goes over its `OpPeers` and is reported to the recorder only, with args
{"parent": op_id, "phase", "step", "chunk", "seg", "tag"}.
Tags (see kernels.comm.p2p.HAND_TAG_BASE): base + 4 * (op sequence number on the group) + phase.

Every chunk is cut into segments of SEGMENT_BYTES (at most MAX_SEGMENTS of them) so that
folding segment k overlaps with the transfer of segment k+1.
"""
from __future__ import annotations

import queue
import threading

import torch

from kernels.comm.core import Group, issue_op
from kernels.comm.handles import Handle
from kernels.comm.p2p import HAND_TAG_BASE, HAND_TAG_SPAN, p2p_step

SEGMENT_BYTES = 1 << 20            # pipelining grain; small ops go in one segment
MAX_SEGMENTS = 8                   # per chunk: each segment is a thread wake-up, dear on a busy host
PHASES = {"reduce_scatter": 0, "all_gather": 1, "chain": 2, "pairwise": 3}


# ---------------------------------------------------------------- lanes, tags and handles

class Lane:
    """One worker thread per process group: its hand ops run one after another, in issue order."""

    def __init__(self, pg, name: str):
        self.pg, self.seq = pg, 0
        self._scratch: dict[tuple, torch.Tensor] = {}
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, daemon=True, name=f"hand-collectives-{name}").start()

    def _loop(self) -> None:
        while True:
            job, fut = self.jobs.get()
            try:
                job()
            except BaseException as e:  # noqa: BLE001 - the waiter re-raises it
                fut.set_exception(e)
            else:
                fut.set_result(None)

    def scratch(self, key: str, like: torch.Tensor, numel: int) -> torch.Tensor:
        """A receive / fold buffer kept between ops: fresh pages cost more than the transfer."""
        t = self._scratch.get((key, like.dtype, like.device))
        if t is None or t.numel() < numel:
            t = self._scratch[key, like.dtype, like.device] = like.new_empty(numel)
        return t[:numel]


_lanes: dict[int, Lane] = {}
_lanes_lock = threading.Lock()


def _lane(group: Group) -> Lane:
    with _lanes_lock:
        lane = _lanes.get(id(group.pg))
        if lane is None or lane.pg is not group.pg:  # a new world may reuse an old id
            lane = _lanes[id(group.pg)] = Lane(group.pg, group.name)
        return lane


def op_tag(seq: int, phase: str) -> int:
    """The p2p tag of one phase of the seq-th hand op on a group (same on every member)."""
    return HAND_TAG_BASE + 4 * (seq % (HAND_TAG_SPAN // 4)) + PHASES[phase]


class _LaneWork:
    """What Handle expects of torch's Work, over a torch Future the lane completes."""

    def __init__(self):
        self.fut = torch.futures.Future()

    def get_future(self):
        return self.fut

    def wait(self):
        self.fut.wait()  # re-raises the lane's exception
        return True

    def is_completed(self) -> bool:
        return self.fut.done()


class OpPeers:
    """One op's view of its group: neighbours by group index, every step traced under the op."""

    def __init__(self, group: Group, op_id: int, seq: int, lane: Lane):
        self.group, self.op_id, self.seq, self.lane = group, op_id, seq, lane
        self.n, self.r = group.size, group.rank
        self.flight_seq = 0     # the outer op's Seq (kernels.comm.flight), its steps' identity

    def _step(self, kind, t, peer, phase, **where):
        return p2p_step(kind, t, self.group.ranks[peer % self.n], self.group,
                        op_tag(self.seq, phase), self.op_id,
                        {"phase": phase, **where, "Seq": self.flight_seq})

    def send(self, t, to, phase, **where):
        return self._step("send", t, to, phase, **where)

    def recv(self, t, frm, phase, **where):
        return self._step("recv", t, frm, phase, **where)


def submit(op: str, group: Group, nbytes: int, result, async_op: bool, body, **args):
    """Record the op, queue body(peers) on the group's lane; a Handle if async, else the result."""
    if group.pg is None:
        raise ValueError(f"group {group.name!r} of {group.size} ranks has no process group: "
                         f"make it with comm.new_groups")
    lane = _lane(group)
    seq, lane.seq = lane.seq, lane.seq + 1
    rec = issue_op(op, group, nbytes, None, impl="hand", **args)
    peers = OpPeers(group, rec.op_id, seq, lane)
    peers.flight_seq = rec.seq
    work = _LaneWork()
    handle = Handle(rec, work, result)

    def job():
        body(peers)
        handle.mark_complete()   # completion = data in place, before any waiter wakes

    lane.jobs.put((job, work.fut))
    if async_op:
        return handle
    handle.wait()
    return result


# ---------------------------------------------------------------- chunks and segments

def chunk_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """n elements in `parts` near-equal chunks (the first n % parts one longer; some may be 0)."""
    q, extra = divmod(n, parts)
    out, a = [], 0
    for i in range(parts):
        b = a + q + (1 if i < extra else 0)
        out.append((a, b))
        a = b
    return out


def segments(n: int, seg: int) -> list[tuple[int, int]]:
    """[a, b) of each seg-element segment of n elements (the last may be shorter)."""
    return [(a, min(a + seg, n)) for a in range(0, n, seg)]


def segment_len(t: torch.Tensor, chunk: int) -> int:
    """Elements per segment of a `chunk`-element chunk: SEGMENT_BYTES, but at most MAX_SEGMENTS."""
    return max(1, SEGMENT_BYTES // t.element_size(), -(-chunk // MAX_SEGMENTS))


def flat_view(t: torch.Tensor, what: str) -> torch.Tensor:
    """t as one flat view (the ops write into it in place, so no copy is allowed)."""
    if not t.is_contiguous():
        raise ValueError(f"hand {what} needs a contiguous tensor: pass t.contiguous() and copy back")
    return t.view(-1)
