"""Collectives by hand over isend / irecv: what gloo and NCCL do inside, written out.

    reduce-scatter  ring, N-1 steps: at step s rank r sends chunk r-s-1 to r+1 and folds chunk
                    r-s-2 from r-1 into its own; after N-1 steps rank r holds the reduced chunk r.
    all-gather      ring, N-1 steps: at step s rank r forwards chunk r-s to r+1.
    all-reduce      reduce-scatter then all-gather, in place (each link carries 2(N-1)/N of it).
    broadcast       a pipelined chain src -> src+1 -> ...: a rank forwards a segment on arrival.
    all-to-all      pairwise exchange, N-1 steps: at step k send to r+k, receive from r-k.

Chunks go in segments (kernels.comm.lanes), so folding segment k overlaps with the transfer of
segment k+1 and a rank forwards segment k as soon as it has folded it. Each op runs on its
group's lane as one recorded comm op (kernels.comm.lanes.submit). Importing this module registers
the five ops with kernels.comm.core, which calls them when `comm.set_collectives("hand")`.
"""
from __future__ import annotations

import torch

from kernels.comm.core import Group, register_hand_collectives, tensor_bytes
from kernels.comm.lanes import OpPeers, chunk_bounds, flat_view, segment_len, segments, submit

_FOLD = {"sum": torch.add, "avg": torch.add, "max": torch.maximum, "min": torch.minimum}


def _check_reduce(op: str) -> None:
    if op not in _FOLD:
        raise ValueError(f"unknown reduction {op!r}: pick one of {', '.join(_FOLD)}")


# ---------------------------------------------------------------- the rings

def _ring_reduce_scatter(peers: OpPeers, sizes: list[int], mine, dst, fold, seg: int, buf,
                         on_done=None) -> None:
    """mine(c): this rank's contribution to chunk c; dst(c, s): where the folded chunk c of step
    s goes (it is also what step s+1 sends). buf: receive space of the largest chunk.
    on_done(k, a, b): segment k of the final chunk is reduced (all-reduce forwards it at once)."""
    n, r, steps = peers.n, peers.r, peers.n - 1
    send_c = lambda s: (r - s - 1) % n                     # noqa: E731
    recv_c = lambda s: (r - s - 2) % n                     # noqa: E731
    sent: dict[tuple[int, int], object] = {}
    for k, (a, b) in enumerate(segments(sizes[send_c(0)], seg)):
        sent[0, k] = peers.send(mine(send_c(0))[a:b], r + 1, "reduce_scatter", step=0,
                               chunk=send_c(0), seg=k)
    pending = {k: peers.recv(buf[a:b], r - 1, "reduce_scatter", step=0, chunk=recv_c(0), seg=k)
               for k, (a, b) in enumerate(segments(sizes[recv_c(0)], seg))}
    for s in range(steps):
        c, last = recv_c(s), s == steps - 1
        here, out, own = segments(sizes[c], seg), dst(c, s), mine(c)
        ahead = [] if last else segments(sizes[recv_c(s + 1)], seg)
        nxt = {}
        for k, (a, b) in enumerate(here):
            pending[k].wait()
            if (s - 1, k) in sent:                         # out[a:b] may still be on the wire
                sent.pop((s - 1, k)).wait()
            fold(own[a:b], buf[a:b], out=out[a:b])
            if last and on_done is not None:
                on_done(k, a, b)
            if not last:
                sent[s + 1, k] = peers.send(out[a:b], r + 1, "reduce_scatter", step=s + 1,
                                           chunk=c, seg=k)
                if k < len(ahead):                         # buf[a:b] is folded: reuse it
                    a2, b2 = ahead[k]
                    nxt[k] = peers.recv(buf[a2:b2], r - 1, "reduce_scatter", step=s + 1,
                                       chunk=recv_c(s + 1), seg=k)
        for k in range(len(here), len(ahead)):
            a2, b2 = ahead[k]
            nxt[k] = peers.recv(buf[a2:b2], r - 1, "reduce_scatter", step=s + 1,
                               chunk=recv_c(s + 1), seg=k)
        pending = nxt
    for w in sent.values():
        w.wait()


def _ring_all_gather(peers: OpPeers, chunk, sizes: list[int], seg: int, sends=None) -> None:
    """chunk(c): the view of chunk c in the output; rank r's own chunk r is already there.
    sends: step 0's sends if the caller issued them already (all-reduce, segment by segment)."""
    n, r, steps = peers.n, peers.r, peers.n - 1
    recv_c = lambda s: (r - s - 1) % n                     # noqa: E731
    if sends is None:
        sends = [peers.send(chunk(r)[a:b], r + 1, "all_gather", step=0, chunk=r, seg=k)
                 for k, (a, b) in enumerate(segments(sizes[r], seg))]
    recvs = [[peers.recv(chunk(recv_c(s))[a:b], r - 1, "all_gather", step=s, chunk=recv_c(s), seg=k)
              for k, (a, b) in enumerate(segments(sizes[recv_c(s)], seg))] for s in range(steps)]
    for s in range(steps):
        c = recv_c(s)
        for k, (a, b) in enumerate(segments(sizes[c], seg)):
            recvs[s][k].wait()
            if s + 1 < steps:                              # forward it the moment it lands
                sends.append(peers.send(chunk(c)[a:b], r + 1, "all_gather", step=s + 1,
                                       chunk=c, seg=k))
    for w in sends:
        w.wait()


# ---------------------------------------------------------------- the collectives

def all_reduce(t: torch.Tensor, group: Group, op: str = "sum", async_op: bool = False):
    """In place: ring reduce-scatter, then ring all-gather; each reduced segment of the owned chunk
    (avg: divided by N) starts round the ring again the moment it is done."""
    _check_reduce(op)
    flat = flat_view(t, "all_reduce")
    n = group.size
    bounds = chunk_bounds(flat.numel(), n)
    sizes = [b - a for a, b in bounds]
    chunk = lambda c: flat[bounds[c][0]:bounds[c][1]]      # noqa: E731

    def body(peers: OpPeers) -> None:
        seg = segment_len(flat, max(sizes))
        buf = peers.lane.scratch("recv", flat, max(sizes))   # [largest chunk]
        owned, first = chunk(peers.r), []

        def hand_off(k, a, b):
            if op == "avg":
                owned[a:b].div_(n)
            first.append(peers.send(owned[a:b], peers.r + 1, "all_gather", step=0, chunk=peers.r,
                                   seg=k))

        _ring_reduce_scatter(peers, sizes, chunk, lambda c, s: chunk(c), _FOLD[op], seg, buf,
                             hand_off)
        _ring_all_gather(peers, chunk, sizes, seg, first)

    return submit("all_reduce", group, tensor_bytes(t), t, async_op, body, tensors=(t,), reduce=op,
                  algo="ring")


def reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group: Group, op: str = "sum",
                   async_op: bool = False):
    """inp [group.size * out.numel()] flat; rank i gets chunk i reduced over the group."""
    _check_reduce(op)
    n, m = group.size, out.numel()
    src, dst_flat = flat_view(inp, "reduce_scatter input"), flat_view(out, "reduce_scatter output")
    if src.numel() != n * m or inp.dtype != out.dtype:
        raise ValueError(f"reduce_scatter: input has {src.numel()} {inp.dtype} elements, output "
                         f"{m} {out.dtype}: the input must be group size {n} x output, same dtype")
    mine = lambda c: src[c * m:(c + 1) * m]                # noqa: E731

    def body(peers: OpPeers) -> None:
        acc = [peers.lane.scratch(f"acc{i}", out, m) for i in (0, 1)]  # [m] x 2
        last = n - 2
        dst = lambda c, s: dst_flat if s == last else acc[s % 2]  # noqa: E731 - input stays intact
        _ring_reduce_scatter(peers, [m] * n, mine, dst, _FOLD[op], segment_len(out, m),
                             peers.lane.scratch("recv", out, m))
        if op == "avg":
            dst_flat.div_(n)

    return submit("reduce_scatter", group, tensor_bytes(inp), out, async_op, body,
                  tensors=(inp, out), reduce=op, algo="ring")


def all_gather(out: torch.Tensor, inp: torch.Tensor, group: Group, async_op: bool = False):
    """out [group.size * inp.numel()]: every rank's inp, in group order."""
    n, m = group.size, inp.numel()
    dst, src = flat_view(out, "all_gather output"), flat_view(inp, "all_gather input")
    if dst.numel() != n * m or inp.dtype != out.dtype:
        raise ValueError(f"all_gather: output has {dst.numel()} {out.dtype} elements, input {m} "
                         f"{inp.dtype}: the output must be group size {n} x input, same dtype")

    def body(peers: OpPeers) -> None:
        dst[peers.r * m:(peers.r + 1) * m].copy_(src)
        _ring_all_gather(peers, lambda c: dst[c * m:(c + 1) * m], [m] * n, segment_len(out, m))

    return submit("all_gather", group, tensor_bytes(out), out, async_op, body, tensors=(inp, out),
                  algo="ring")


def broadcast(t: torch.Tensor, src: int, group: Group, async_op: bool = False):
    """src is a global rank; a chain from src through the group in order, segment by segment."""
    if src not in group.ranks:
        raise ValueError(f"broadcast source {src} is not in group {group.name!r} {group.ranks}")
    flat = flat_view(t, "broadcast")
    root = group.ranks.index(src)

    def body(peers: OpPeers) -> None:
        n, pos = peers.n, (peers.r - root) % peers.n          # place in the chain, src at 0
        segs = segments(flat.numel(), segment_len(flat, flat.numel()))
        sends = []
        if pos == 0:
            sends = [peers.send(flat[a:b], peers.r + 1, "chain", seg=k) for k, (a, b) in enumerate(segs)]
        else:
            recvs = [peers.recv(flat[a:b], peers.r - 1, "chain", seg=k) for k, (a, b) in enumerate(segs)]
            for k, (a, b) in enumerate(segs):
                recvs[k].wait()
                if pos < n - 1:                            # forward on arrival: the pipeline
                    sends.append(peers.send(flat[a:b], peers.r + 1, "chain", seg=k))
        for w in sends:
            w.wait()

    return submit("broadcast", group, tensor_bytes(t), t, async_op, body, tensors=(t,), src=src,
                  algo="chain")


def _split_offsets(splits, rows: int, n: int, what: str) -> list[tuple[int, int]]:
    if splits is None:
        if rows % n:
            raise ValueError(f"all_to_all: {what} has {rows} rows, not divisible by group size {n}: "
                             f"pass {what} splits")
        splits = [rows // n] * n
    if len(splits) != n or sum(splits) != rows or min(splits) < 0:
        raise ValueError(f"all_to_all: {what} splits {list(splits)} must be {n} sizes >= 0 "
                         f"summing to its {rows} rows")
    out, a = [], 0
    for s in splits:
        out.append((a, a + s))
        a += s
    return out


def all_to_all_single(out: torch.Tensor, inp: torch.Tensor, group: Group,
                      out_splits=None, in_splits=None, async_op: bool = False):
    """Rows of inp go to each rank by in_splits; rows of out come from each by out_splits."""
    n = group.size
    if inp.dim() == 0 or out.dim() == 0 or inp.shape[1:] != out.shape[1:] or inp.dtype != out.dtype:
        raise ValueError(f"all_to_all: input {tuple(inp.shape)} {inp.dtype} and output "
                         f"{tuple(out.shape)} {out.dtype} need the same row shape and dtype")
    row = inp[0].numel() if inp.shape[0] else out[0].numel() if out.shape[0] else 0
    ins = _split_offsets(in_splits, inp.shape[0], n, "input")
    outs = _split_offsets(out_splits, out.shape[0], n, "output")
    src, dst = flat_view(inp, "all_to_all input"), flat_view(out, "all_to_all output")
    piece = lambda flat, off, c: flat[off[c][0] * row:off[c][1] * row]  # noqa: E731

    def body(peers: OpPeers) -> None:
        r = peers.r
        piece(dst, outs, r).copy_(piece(src, ins, r))
        for k in range(1, n):                              # pairwise: r+k gets mine, r-k sends me its
            to, frm = (r + k) % n, (r - k) % n
            steps = []
            if ins[to][1] > ins[to][0]:
                steps.append(peers.send(piece(src, ins, to), to, "pairwise", step=k - 1, chunk=to))
            if outs[frm][1] > outs[frm][0]:
                steps.append(peers.recv(piece(dst, outs, frm), frm, "pairwise", step=k - 1,
                                       chunk=frm))
            for w in steps:
                w.wait()

    return submit("all_to_all", group, tensor_bytes(inp) + tensor_bytes(out), out, async_op, body,
                  tensors=(inp, out), algo="pairwise")


register_hand_collectives({"all_reduce": all_reduce, "reduce_scatter": reduce_scatter,
                           "all_gather": all_gather, "broadcast": broadcast,
                           "all_to_all_single": all_to_all_single})
