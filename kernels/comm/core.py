"""The only door to torch.distributed: named, timed, recorded collectives and point-to-point ops.

Every op carries its group name (dp / tp / pp / cp / ep / world) and byte count, and reports
issue, completion and wait to the recorder in `kernels.comm.events`. An async op returns a `Handle`
whose completion time is taken when its future completes (in gloo's thread), not when waited on.
`OpLog` keeps the same timestamps even without tracing, so overlap can be measured cheaply.

`set_collectives("hand")` routes all_reduce / reduce_scatter / all_gather / broadcast /
all_to_all_single to `kernels.comm.collectives` (rings, chains and pairwise exchanges over p2p);
each stays ONE op here (one OpLog record, one comm_issue) and its p2p steps are reported to the
recorder only, with args {"parent": outer op_id}. Tags: user p2p (the pipeline's) must stay below
HAND_TAG_BASE; [HAND_TAG_BASE, HAND_TAG_BASE + HAND_TAG_SPAN) belongs to hand collectives.
"""
from __future__ import annotations

import datetime
import itertools
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from kernels.comm import events
from kernels.comm.handles import AvgHandle as _AvgHandle
from kernels.comm.handles import Handle, OpLog, OpRecord, oplog  # noqa: F401 (the comm API)

_op_ids = itertools.count(1)
_REDUCE = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
REDUCE_OPS = ("sum", "avg", "max", "min")
COLLECTIVES = ("native", "hand")
HAND_TAG_BASE = 1 << 24   # p2p tags from here on are reserved for hand collectives
HAND_TAG_SPAN = 1 << 20   # 2**18 ops in flight per group x 4 phases (see collectives.op_tag)
_collectives = "native"
_P2P_FUTURES: dict = {}    # {"has": bool} once the world's backend is known; cleared by init / destroy


def set_collectives(mode: str) -> None:
    """native: torch's (gloo / nccl) collectives; hand: kernels.comm.collectives over isend/irecv."""
    global _collectives
    if mode not in COLLECTIVES:
        raise ValueError(f"unknown collectives {mode!r}: pick native or hand")
    _collectives = mode


def collectives_mode() -> str:
    return _collectives


def _hand(group: Group | None) -> bool:
    return _collectives == "hand" and (group is None or group.size > 1) and is_initialized()


# ---------------------------------------------------------------- world and groups

def init(backend: str, rank: int, world_size: int, init_method: str | None = None,
         timeout_s: float = 60.0, store=None) -> None:
    kw = {"init_method": init_method} if init_method else {}
    if store is not None:
        kw = {"store": store}
    _P2P_FUTURES.clear()
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s), **kw)


def store_server(world_size: int, timeout_s: float = 30.0):
    """A rendezvous store listening on a free port of 127.0.0.1 (port 0: the OS picks one, so
    two worlds never race for a port). Returns (store, port); rank 0 keeps the store alive."""
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True,
                          timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
    return store, store.port


def store_client(port: int, world_size: int, timeout_s: float = 30.0):
    return dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def destroy() -> None:
    _P2P_FUTURES.clear()
    if is_initialized():
        dist.destroy_process_group()


def world_rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


@dataclass
class Group:
    """A process group with a name and its member ranks (global ids, in group order)."""
    name: str
    ranks: list[int]
    pg: object = None  # torch ProcessGroup; None for a group of one

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def rank(self) -> int:
        """This process's index inside the group."""
        return self.ranks.index(world_rank())

    def global_rank(self, local: int) -> int:
        return self.ranks[local]


def new_groups(name: str, partition: list[list[int]]) -> Group:
    """Create one group per rank list (every rank must call this with the same partition) and
    return the one holding this rank. Groups of size 1 make no process group."""
    me = world_rank()
    mine = None
    for ranks in partition:
        ranks = sorted(ranks)  # torch numbers a group's members in sorted order; so do we
        pg = dist.new_group(ranks) if len(ranks) > 1 and is_initialized() else None
        if me in ranks:
            mine = Group(name, list(ranks), pg)
    assert mine is not None, f"rank {me} is in no {name} group"
    return mine


def single_group(name: str = "world") -> Group:
    return Group(name, [world_rank()], None)


def world_group() -> Group:
    return Group("world", list(range(world_size())), dist.group.WORLD if is_initialized() else None)


def _issue(op: str, group: Group | None, nbytes: int, peer: int | None, **args) -> OpRecord:
    rec = OpRecord(next(_op_ids), op, group.name if group else "world", int(nbytes), peer,
                   events.now_ns())
    oplog.add(rec)
    r = events.recorder()
    if r is not None and hasattr(r, "comm_issue"):
        r.comm_issue(rec.op_id, op, rec.group, rec.nbytes, peer, rec.t_issue, args)
    return rec


def _run(rec: OpRecord, work, result, async_op: bool):
    h = Handle(rec, work, result)
    if async_op:
        return h
    h.wait()
    return result


def _pg(group: Group | None):
    return None if group is None else group.pg


def _trivial(group: Group | None) -> bool:
    """A group of one, or no world at all (a single process): nothing to exchange."""
    return (group is not None and group.size == 1) or not is_initialized()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _done(op, group, result, async_op):
    """A group of one: nothing moves, but the op still exists (recorded, zero bytes)."""
    rec = _issue(op, group, 0, None)
    rec.t_complete = rec.t_issue
    r = events.recorder()
    if r is not None and hasattr(r, "comm_complete"):
        r.comm_complete(rec.op_id, rec.t_complete)
    return Handle(rec, None, result) if async_op else result


# ---------------------------------------------------------------- collectives

def all_reduce(t: torch.Tensor, group: Group | None, op: str = "sum", async_op: bool = False):
    """In place. op: sum | avg | max | min (avg is sum then divide, done at wait for async)."""
    if _trivial(group):
        return _done("all_reduce", group, t, async_op)
    if _hand(group):
        return _collectives_module().all_reduce(t, group or world_group(), op, async_op)
    rec = _issue("all_reduce", group, _nbytes(t), None, reduce=op)
    work = dist.all_reduce(t, op=_REDUCE["sum" if op == "avg" else op], group=_pg(group),
                           async_op=True)
    if op == "avg":
        return _AvgHandle(rec, work, t, group.size if group else world_size()) if async_op \
            else _run(rec, work, t, False).div_(group.size if group else world_size())
    return _run(rec, work, t, async_op)


def reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group: Group | None, op: str = "sum",
                   async_op: bool = False):
    """inp is [group.size * out.numel()] flat (rank i gets chunk i), summed over the group."""
    if _trivial(group):
        out.copy_(inp.view_as(out))
        return _done("reduce_scatter", group, out, async_op)
    if _hand(group):
        return _collectives_module().reduce_scatter(out, inp, group or world_group(), op, async_op)
    rec = _issue("reduce_scatter", group, _nbytes(inp), None, reduce=op)
    work = dist.reduce_scatter_single(out, inp, op=_REDUCE["sum" if op == "avg" else op],
                                      group=_pg(group), async_op=True)
    n = group.size if group else world_size()
    if op == "avg":
        return _AvgHandle(rec, work, out, n) if async_op else _run(rec, work, out, False).div_(n)
    return _run(rec, work, out, async_op)


def all_gather(out: torch.Tensor, inp: torch.Tensor, group: Group | None, async_op: bool = False):
    """out is [group.size * inp.numel()] (concatenated along dim 0 in group order)."""
    if _trivial(group):
        out.copy_(inp.view_as(out))
        return _done("all_gather", group, out, async_op)
    if _hand(group):
        return _collectives_module().all_gather(out, inp, group or world_group(), async_op)
    rec = _issue("all_gather", group, _nbytes(out), None)
    work = dist.all_gather_single(out, inp, group=_pg(group), async_op=True)
    return _run(rec, work, out, async_op)


def broadcast(t: torch.Tensor, src: int, group: Group | None, async_op: bool = False):
    """src is a global rank."""
    if _trivial(group):
        return _done("broadcast", group, t, async_op)
    if _hand(group):
        return _collectives_module().broadcast(t, src, group or world_group(), async_op)
    rec = _issue("broadcast", group, _nbytes(t), src)
    work = dist.broadcast(t, src=src, group=_pg(group), async_op=True)
    return _run(rec, work, t, async_op)


def all_to_all_single(out: torch.Tensor, inp: torch.Tensor, group: Group | None,
                      out_splits: list[int] | None = None, in_splits: list[int] | None = None,
                      async_op: bool = False):
    """Split dim 0 of inp into pieces for each group rank; uneven splits allowed."""
    if _trivial(group):
        out.copy_(inp)
        return _done("all_to_all", group, out, async_op)
    if _hand(group):
        return _collectives_module().all_to_all_single(out, inp, group or world_group(),
                                                       out_splits, in_splits, async_op)
    rec = _issue("all_to_all", group, _nbytes(inp) + _nbytes(out), None)
    work = dist.all_to_all_single(out, inp, output_split_sizes=out_splits,
                                  input_split_sizes=in_splits, group=_pg(group), async_op=True)
    return _run(rec, work, out, async_op)


def barrier(group: Group | None = None) -> None:
    if _trivial(group) or not is_initialized():
        return
    rec = _issue("barrier", group, 0, None)
    _run(rec, dist.barrier(group=_pg(group), async_op=True), None, False)


# ---------------------------------------------------------------- point to point (global ranks)

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
    rec = _issue("send", group, _nbytes(t), dst, tag=tag)
    return Handle(rec, dist.isend(t, dst, tag=tag), t, future=_p2p_futures())


def irecv(t: torch.Tensor, src: int, group: Group | None = None, tag: int = 0) -> Handle:
    _check_tag(tag)
    rec = _issue("recv", group, _nbytes(t), src, tag=tag)
    return Handle(rec, dist.irecv(t, src, tag=tag), t, future=_p2p_futures())


def _p2p_futures() -> bool:
    """Whether this backend's p2p work has a future: nccl's has, gloo's has not (cached per world)."""
    if "has" not in _P2P_FUTURES:
        _P2P_FUTURES["has"] = dist.get_backend() != "gloo"
    return _P2P_FUTURES["has"]


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


def wait_all(handles) -> None:
    for h in handles:
        h.wait()


# ---------------------------------------------------------------- the steps of hand collectives

def _collectives_module():
    from kernels.comm import collectives  # lazy: collectives imports this module
    return collectives


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
    sid = next(_op_ids)
    r.comm_issue(sid, kind, group.name, _nbytes(t), peer, t0, {"parent": parent, "tag": tag, **args})
    return _TracedStep(work, sid, r)


class _TracedStep:
    """A traced p2p step: complete when its future fires, or (gloo's p2p has none) when the
    collective's lane waits for it."""

    def __init__(self, work, sid: int, r):
        self.work, self.sid, self.r, self.done = work, sid, r, False
        if _p2p_futures():
            try:
                work.get_future().add_done_callback(lambda _f: self._complete())
            except RuntimeError:
                pass

    def _complete(self) -> None:
        if not self.done and hasattr(self.r, "comm_complete"):
            self.done = True
            self.r.comm_complete(self.sid, events.now_ns())

    def wait(self):
        self.work.wait()
        self._complete()
        return True
