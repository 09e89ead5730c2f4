"""The only door to torch.distributed: the world, its named groups, and recorded collectives.

Every op carries its group name (dp / tp / pp / cp / ep / world) and byte count, and reports
issue, completion and wait to the recorder in `kernels.comm.events`. An async op returns a `Handle`
whose completion time is taken when its future completes (in gloo's thread), not when waited on;
`OpLog` keeps the same timestamps even without tracing. partui's own worlds listen on loopback only.

`set_collectives("hand")` routes all_reduce / reduce_scatter / all_gather / broadcast /
all_to_all_single to the hand implementations registered with `register_hand_collectives`
(kernels.comm.collectives registers its rings, chains and pairwise exchanges when imported);
each stays ONE op here (one OpLog record, one comm_issue), its p2p steps reported to the recorder
only (kernels.comm.p2p.p2p_step). Point-to-point ops live in kernels.comm.p2p.
"""
from __future__ import annotations

import datetime
import itertools
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kernels.comm import emulate, events, faults, validate
from kernels.comm.dry import ON_PAPER
from kernels.comm.flight import recorder as flight
from kernels.comm.handles import AvgHandle, Handle, OpRecord, oplog
from kernels.comm.poster import launch as post
from kernels.comm.poster import stop as stop_posting

_op_ids = itertools.count(1)
_REDUCE = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
COLLECTIVES = ("native", "hand")
HAND_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all_single")
_collectives = "native"
_hand_impls: dict = {}     # {op name: fn}, filled by register_hand_collectives
_P2P_FUTURES: dict = {}    # {"has": bool} once the world's backend is known; cleared by init / destroy
_GROUPS: dict = {}         # {name: Group} this rank's multi-rank groups (a group-order fault's other)
_VALIDATE: dict = {}       # {"on": True} while --validate-comms checks each collective first


def register_hand_collectives(impls: dict) -> None:
    """Install the hand implementations of HAND_OPS ({name: fn}, same signatures as here but with
    a Group always given); kernels.comm.collectives calls this when it is imported."""
    unknown = sorted(set(impls) - set(HAND_OPS))
    if unknown:
        raise ValueError(f"cannot register hand collectives {unknown}: the hand ops are "
                         f"{', '.join(HAND_OPS)}")
    _hand_impls.update(impls)


def set_collectives(mode: str) -> None:
    """native: torch's (gloo / nccl) collectives; hand: the registered ones over isend/irecv."""
    global _collectives
    if mode not in COLLECTIVES:
        raise ValueError(f"unknown collectives {mode!r}: pick native or hand")
    missing = [op for op in HAND_OPS if op not in _hand_impls]
    if mode == "hand" and missing:
        raise ValueError(f"hand collectives {', '.join(missing)} are not registered: import "
                         f"kernels.comm (the package registers kernels.comm.collectives) or pick "
                         f"native")
    _collectives = mode


def _hand_impl(op: str, group: Group | None):
    """The registered hand implementation of op if hand collectives are on for this group."""
    if _collectives == "hand" and (group is None or group.size > 1) and is_initialized():
        return _hand_impls[op]
    return None


# ---------------------------------------------------------------- world and groups

def init(backend: str, rank: int, world_size: int, init_method: str | None = None,
         timeout_s: float = 60.0, store=None) -> None:
    """With partui's loopback store, gloo listens on loopback too; under torchrun MASTER_ADDR decides."""
    kw = {"store": store} if store is not None else {"init_method": init_method} if init_method else {}
    if store is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"   # not setdefault: a user's eth0 would listen outside
    _P2P_FUTURES.clear()
    flight.clear()             # a new world's ops start at Seq 1 (a forked rank inherits its parent's)
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s), **kw)
    except dist.DistNetworkError as e:       # torch's own: callers outside comm/ never import it
        raise RendezvousError(str(e)) from e


class RendezvousError(RuntimeError):
    """The rendezvous could not listen or connect (most often under torchrun: the port is taken)."""


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def destroy() -> None:
    stop_posting()
    _P2P_FUTURES.clear()
    _GROUPS.clear()
    if is_initialized():
        dist.destroy_process_group()


def world_rank() -> int:
    return dist.get_rank() if is_initialized() else ON_PAPER.get("rank", 0)


def world_size() -> int:
    return dist.get_world_size() if is_initialized() else ON_PAPER.get("size", 1)


def p2p_work_has_future() -> bool:
    """Whether this backend's p2p work has a future: nccl's has, gloo's has not (cached per world)."""
    if "has" not in _P2P_FUTURES:
        _P2P_FUTURES["has"] = dist.get_backend() != "gloo"
    return _P2P_FUTURES["has"]


@dataclass
class Group:
    """A process group with a name and its member ranks (global ids, in group order)."""
    name: str
    ranks: list[int]
    pg: object = None  # torch ProcessGroup; None for a group of one
    posted: bool = False  # its ops are posted by the comm thread (kernels.comm.poster)
    check_pg: object = None  # a gloo group beside pg for --validate-comms' metadata all-gather

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
        # group_desc: torch's flight recorder names the group as partui does
        pg = dist.new_group(ranks, group_desc=name) if len(ranks) > 1 and is_initialized() else None
        check = dist.new_group(ranks, backend="gloo") if pg is not None and _VALIDATE else None
        if me in ranks:
            mine = Group(name, list(ranks), pg, check_pg=check)
            if pg is not None:
                _GROUPS[name] = mine
    assert mine is not None, f"rank {me} is in no {name} group"
    return mine


def single_group(name: str = "world") -> Group:
    return Group(name, [world_rank()], None)


def world_group() -> Group:
    return Group("world", list(range(world_size())), dist.group.WORLD if is_initialized() else None)


# ---------------------------------------------------------------- recording ops

def next_op_id() -> int:
    """A fresh op id, unique in this process (outer ops and the p2p steps of hand collectives)."""
    return next(_op_ids)


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def issue_op(op: str, group: Group | None, nbytes: int, peer: int | None, tensors=(),
             **args) -> OpRecord:
    """Record an op as issued now: its identity and place in the flight recorder (Seq, Comms Id,
    the shapes and dtypes of `tensors`), one OpLog record, and comm_issue to the recorder, whose
    args carry Kineto's "Process Group Name", "Seq" and "Comms Id". Under --validate-comms a
    collective is first compared across its group (kernels.comm.validate), before it is posted."""
    rec = OpRecord(next_op_id(), op, group.name if group else "world", int(nbytes), peer,
                   events.now_ns(), tag=args.get("tag", 0),
                   shapes=tuple(tuple(t.shape) for t in tensors),
                   dtypes=tuple(dtype_name(t) for t in tensors))
    ranks = group.ranks if group is not None else range(world_size())
    flight.identify(rec, ranks, world_rank())
    rec.ranks = tuple(ranks)
    if _VALIDATE and op not in ("send", "recv") and group is not None and group.check_pg is not None:
        validate.check(rec, group)
    args = {**args, "Process Group Name": rec.group, "Seq": rec.seq, "Comms Id": rec.comms_id}
    if emulate.model() is not None:
        ranks = group.ranks if group is not None else list(range(world_size()))
        rec.hold = emulate.on_issue(op, rec.group, ranks, rec.nbytes, peer, args.get("tag", 0),
                                    rec.t_issue)
    oplog.add(rec)
    r = events.recorder()
    if r is not None and hasattr(r, "comm_issue"):
        r.comm_issue(rec.op_id, op, rec.group, rec.nbytes, peer, rec.t_issue, args)
    events.mark(f"{op} {rec.group}", "issue", rec.t_issue, op_id=rec.op_id, op=op,
                group=rec.group, bytes=rec.nbytes, peer=peer, seq=rec.seq)
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


def _done(op, group, result, async_op):
    """A group of one: nothing moves, but the op still exists (recorded, zero bytes)."""
    rec = issue_op(op, group, 0, None)
    rec.t_complete = rec.t_issue
    flight.completed(rec)
    r = events.recorder()
    if r is not None and hasattr(r, "comm_complete"):
        r.comm_complete(rec.op_id, rec.t_complete)
    return Handle(rec, None, result) if async_op else result


# ---------------------------------------------------------------- faults and checks

def _launch(group: Group | None, rec: OpRecord, fn):
    """Post the op (here or on the comm thread), then the op a swap fault held behind it."""
    work = post(group, fn)
    if faults.held:
        faults.release_after(rec.group, sum(math.prod(s) for s in rec.shapes[:1]))
    return work


def _strike(op: str, group: Group | None, async_op: bool = False) -> str | None:
    """The kind of the fault striking this op (kernels.comm.faults), after doing what it does
    before the op (late: sleep; group-order: enter another group first); None almost always."""
    if faults.armed is None:
        return None
    kind = faults.take(op, group.name if group else "world", group.size if group else world_size(),
                       world_rank(), async_op)
    if kind == "late":
        faults.late()
    elif kind == "group-order":
        other = next((g for g in _GROUPS.values() if group is None or g.name != group.name), None)
        if other is not None:
            barrier(other)
    return kind


def _skipped(op: str, group: Group | None, result, async_op: bool):
    """A skip fault: the op is never issued (nothing records it); the caller gets its input back."""
    rec = OpRecord(next_op_id(), op, group.name if group else "world", 0, None, events.now_ns())
    return Handle(rec, None, result) if async_op else result


def set_validate(on: bool) -> None:
    """--validate-comms: compare each collective across its group before it runs (groups made
    from now on get the gloo group the check needs)."""
    _VALIDATE.clear()
    if on:
        _VALIDATE["on"] = True


# ---------------------------------------------------------------- collectives

def all_reduce(t: torch.Tensor, group: Group | None, op: str = "sum", async_op: bool = False):
    """In place. op: sum | avg | max | min (avg is sum then divide, done at wait for async)."""
    if _trivial(group):
        return _done("all_reduce", group, t, async_op)
    kind = _strike("all_reduce", group, async_op)
    if kind == "skip":
        return _skipped("all_reduce", group, t, async_op)
    if kind == "swap":
        return faults.hold(group.name if group else "world",
                           lambda: all_reduce(t, group, op, async_op=True), t)
    if hand := _hand_impl("all_reduce", group):
        return hand(faults.bent(kind, t), group or world_group(), op, async_op)
    x = faults.bent(kind, t)
    rec = issue_op("all_reduce", group, tensor_bytes(x), None, (x,), reduce=op)
    red = _REDUCE["sum" if op == "avg" else op]
    work = _launch(group, rec, lambda: dist.all_reduce(x, op=red, group=_pg(group), async_op=True))
    if op == "avg":
        n = group.size if group else world_size()
        return AvgHandle(rec, work, t, n) if async_op else _run(rec, work, t, False).div_(n)
    return _run(rec, work, t, async_op)


def reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group: Group | None, op: str = "sum",
                   async_op: bool = False):
    """inp is [group.size * out.numel()] flat (rank i gets chunk i), summed over the group."""
    if _trivial(group):
        out.copy_(inp.view_as(out))
        return _done("reduce_scatter", group, out, async_op)
    if _strike("reduce_scatter", group) == "skip":
        return _skipped("reduce_scatter", group, out, async_op)
    if hand := _hand_impl("reduce_scatter", group):
        return hand(out, inp, group or world_group(), op, async_op)
    rec = issue_op("reduce_scatter", group, tensor_bytes(inp), None, (inp, out), reduce=op)
    red = _REDUCE["sum" if op == "avg" else op]
    work = _launch(group, rec, lambda: dist.reduce_scatter_single(out, inp, op=red,
                                                                   group=_pg(group), async_op=True))
    n = group.size if group else world_size()
    if op == "avg":
        return AvgHandle(rec, work, out, n) if async_op else _run(rec, work, out, False).div_(n)
    return _run(rec, work, out, async_op)


def all_gather(out: torch.Tensor, inp: torch.Tensor, group: Group | None, async_op: bool = False):
    """out is [group.size * inp.numel()] (concatenated along dim 0 in group order)."""
    if _trivial(group):
        out.copy_(inp.view_as(out))
        return _done("all_gather", group, out, async_op)
    if _strike("all_gather", group) == "skip":
        return _skipped("all_gather", group, out, async_op)
    if hand := _hand_impl("all_gather", group):
        return hand(out, inp, group or world_group(), async_op)
    rec = issue_op("all_gather", group, tensor_bytes(out), None, (inp, out))
    work = _launch(group, rec, lambda: dist.all_gather_single(out, inp, group=_pg(group),
                                                               async_op=True))
    return _run(rec, work, out, async_op)


def broadcast(t: torch.Tensor, src: int, group: Group | None, async_op: bool = False):
    """src is a global rank."""
    if _trivial(group):
        return _done("broadcast", group, t, async_op)
    kind = _strike("broadcast", group)
    if kind == "skip":
        return _skipped("broadcast", group, t, async_op)
    if hand := _hand_impl("broadcast", group):
        return hand(faults.bent(kind, t), src, group or world_group(), async_op)
    x = faults.bent(kind, t)
    rec = issue_op("broadcast", group, tensor_bytes(x), src, (x,))
    work = _launch(group, rec, lambda: dist.broadcast(x, src=src, group=_pg(group), async_op=True))
    return _run(rec, work, t, async_op)


def all_to_all_single(out: torch.Tensor, inp: torch.Tensor, group: Group | None,
                      out_splits: list[int] | None = None, in_splits: list[int] | None = None,
                      async_op: bool = False):
    """Split dim 0 of inp into pieces for each group rank; uneven splits allowed."""
    if _trivial(group):
        out.copy_(inp)
        return _done("all_to_all", group, out, async_op)
    if _strike("all_to_all", group) == "skip":
        return _skipped("all_to_all", group, out, async_op)
    if hand := _hand_impl("all_to_all_single", group):
        return hand(out, inp, group or world_group(), out_splits, in_splits, async_op)
    rec = issue_op("all_to_all", group, tensor_bytes(inp) + tensor_bytes(out), None, (inp, out))
    work = _launch(group, rec, lambda: dist.all_to_all_single(
        out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits, group=_pg(group),
        async_op=True))
    return _run(rec, work, out, async_op)


def barrier(group: Group | None = None) -> None:
    if _trivial(group) or not is_initialized():
        return
    rec = issue_op("barrier", group, 0, None, ())
    _run(rec, _launch(group, rec, lambda: dist.barrier(group=_pg(group), async_op=True)), None,
         False)


def wait_all(handles) -> None:
    for h in handles:
        h.wait()
