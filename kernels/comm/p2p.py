"""Point-to-point ops (global ranks): recorded send / recv, batched exchanges, and the untracked
p2p steps hand collectives are made of.

Tags: user p2p (the pipeline's) must stay below HAND_TAG_BASE; [HAND_TAG_BASE, HAND_TAG_BASE +
HAND_TAG_SPAN) belongs to hand collectives (kernels.comm.lanes.op_tag).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from kernels.comm import events, faults
from kernels.comm.core import (
    Group,
    issue_op,
    next_op_id,
    p2p_work_has_future,
    tensor_bytes,
    world_rank,
)
from kernels.comm.flight import comms_id
from kernels.comm.handles import Handle, OpRecord

HAND_TAG_BASE = 1 << 24   # p2p tags from here on are reserved for hand collectives
HAND_TAG_SPAN = 1 << 20   # 2**18 ops in flight per group x 4 phases (see lanes.op_tag)


def send(t: torch.Tensor, dst: int, group: Group | None = None, tag: int = 0) -> None:
    isend(t, dst, group, tag).wait()


def recv(t: torch.Tensor, src: int, group: Group | None = None, tag: int = 0) -> torch.Tensor:
    return irecv(t, src, group, tag).wait()


def _check_tag(tag: int) -> None:
    if not 0 <= tag < HAND_TAG_BASE:
        raise ValueError(f"p2p tag {tag} is outside [0, {HAND_TAG_BASE}): tags from {HAND_TAG_BASE} "
                         f"on are reserved for hand collectives; pick a smaller tag")


def isend(t: torch.Tensor, dst: int, group: Group | None = None, tag: int = 0) -> Handle:
    _check_tag(tag)
    rec = issue_op("send", group, tensor_bytes(t), dst, (t,), tag=tag)
    return Handle(rec, dist.isend(t, dst, tag=tag), t, future=p2p_work_has_future())


def irecv(t: torch.Tensor, src: int, group: Group | None = None, tag: int = 0) -> Handle:
    _check_tag(tag)
    if faults.armed is not None and faults.take("recv", "p2p", 2, world_rank()) == "drop-recv":
        # the fault: never posted, nothing records it; the caller waits on nothing and goes on
        return Handle(OpRecord(next_op_id(), "recv", group.name if group else "world", 0, src,
                               events.now_ns()), None, t)
    rec = issue_op("recv", group, tensor_bytes(t), src, (t,), tag=tag)
    return Handle(rec, dist.irecv(t, src, tag=tag), t, future=p2p_work_has_future())


@dataclass
class P2P:
    """One leg of a batched exchange: kind 'send' or 'recv', peer a global rank."""
    kind: str
    tensor: torch.Tensor
    peer: int
    tag: int = 0
    group: Group | None = field(default=None, repr=False)


def batch_isend_irecv(ops: list[P2P]) -> list[Handle]:
    """Post every send and recv at once (sends and recvs paired by (peer, tag) order), so two
    ranks exchanging in both directions never deadlock. Returns one handle per op."""
    return [isend(o.tensor, o.peer, o.group, o.tag) if o.kind == "send"
            else irecv(o.tensor, o.peer, o.group, o.tag) for o in ops]


# ---------------------------------------------------------------- the steps of hand collectives

def p2p_step(kind: str, t: torch.Tensor, peer: int, group: Group, tag: int, parent: int,
             args: dict):
    """One send or recv inside a hand collective (peer global, over the group's own process
    group): no OpLog record, so only the outer op counts in overlap statistics; the recorder
    sees comm_issue(op, ...args {"parent": parent, "tag": tag, ...}) and comm_complete.
    Returns torch's work (wait() blocks)."""
    r = events.recorder()
    t0 = events.now_ns() if r is not None else 0
    fn = dist.isend if kind == "send" else dist.irecv
    work = fn(t, peer, group=group.pg, tag=tag)
    if r is None or not hasattr(r, "comm_issue"):
        return work
    step_id = next_op_id()
    # identity: the parent op's Seq; the Comms Id adds the step's direction and tag, so the k-th
    # step a -> b of one hand collective matches on both ends
    me = group.ranks[group.rank]
    src, dst = (me, peer) if kind == "send" else (peer, me)
    seq = args.get("Seq", 0)
    r.comm_issue(step_id, kind, group.name, tensor_bytes(t), peer, t0,
                 {"parent": parent, "tag": tag, **args, "Process Group Name": group.name,
                  "Seq": seq, "Comms Id": comms_id(group.name, seq, f"{src}->{dst}:{tag}")})
    return TracedStep(work, step_id, r)


class TracedStep:
    """A traced p2p step: complete when its future fires, or (gloo's p2p has none) when the
    collective's lane waits for it."""

    def __init__(self, work, step_id: int, recorder):
        self.work, self.step_id, self.recorder, self.done = work, step_id, recorder, False
        if p2p_work_has_future():
            try:
                work.get_future().add_done_callback(lambda _f: self._complete())
            except RuntimeError:  # no future after all: completion is seen at wait()
                pass

    def _complete(self) -> None:
        if not self.done and hasattr(self.recorder, "comm_complete"):
            self.done = True
            self.recorder.comm_complete(self.step_id, events.now_ns())

    def wait(self):
        self.work.wait()
        self._complete()
        return True
