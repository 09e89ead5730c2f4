"""Runs one pp rank's action list (kernels.pp.schedules) for real: async p2p, deferred weight grads and
DualPipe's overlapped forward-and-backward pairs (with fb_overlap, each pair interleaves DeepSeek's parts of
both sides, kernels/pp/parts.py, so the MoE all-to-alls fly under the other microbatch's compute).

Semantics are the schedules' (see that module): RECV posts an irecv and never blocks; a compute waits only for
the tensors it consumes; a tensor a compute produces for another rank is sent the moment it exists (the SEND
action after the compute only checks that it went), and sends are waited at the end of the step, never before
the next compute. Activations and input gradients travel on distinct tags, so each (peer, kind) channel is a
FIFO of its own. A hand-off between two chunks of one rank (DualPipeV's turn on rank P-1) stays local.

DualPipe keeps two copies of the model: rank r runs stage r of direction 0 and stage P-1-r of direction 1, so
stage s's weights live on ranks s and P-1-s. Their grads are partial: each Param lists the "pp_mirror" group in
`replicated_over` so the grad sync sums the two copies before dp sync, and both copies then take the same step.
`meta["accumulations"]`: a Param's `accumulate` calls a step (M, or M/2 for dualpipe), for a dp sync firing on the last.
"""
from __future__ import annotations

import torch

from kernels import comm
from kernels.comm import events
from kernels.cp.layout import sequence_shard
from kernels.ep.layer import overlap_all_to_alls
from kernels.mesh import partition
from kernels.model import Block, LayerHooks
from kernels.pp.actions import COMPUTE_KINDS
from kernels.pp.parts import BackwardParts, ForwardParts, chunk_pair_order, run_carried, run_pair
from kernels.pp.schedules import plan_schedule
from kernels.pp.stages import backward_steps, build_chunks, drive, forward_steps, weight_grads

TAG = {"F": 7101, "B": 7102}   # activations and gradients: one FIFO channel each per peer


def mirror_group(ctx) -> comm.Group:
    """DualPipe: the pairs of pp ranks {r, P-1-r} that hold the same stages (every rank must call this)."""
    pairs = []
    for ranks in partition(ctx.plan, "pp"):                 # global ranks in pp order
        p = len(ranks)
        pairs += [[ranks[i], ranks[p - 1 - i]] for i in range(p // 2)]
    return comm.new_groups("pp_mirror", pairs)


class PipelineRunner:
    """The engine's runner for pp > 1: this rank's chunks and its schedule."""

    def __init__(self, ctx, layers: list, backward: str):
        if backward != "hand":
            raise ValueError(f"pipeline parallel runs the hand-written backward (split into B and W), not "
                             f"{backward!r}: run with backward=hand")
        plan = ctx.plan
        self.ctx, self.plan = ctx, plan
        self.group = ctx.group("pp")
        self.rank = ctx.coords["pp"]
        self.schedule = plan_schedule(plan)
        self.actions = self.schedule.actions[self.rank]
        self.chunks = build_chunks(layers, self.schedule, self.rank)   # the other stages' layers are dropped
        self._params = {}
        for ch in sorted(self.chunks, key=lambda c: c.stage):   # model order: the same on mirrored ranks
            self._params.update(ch.params())
        per_chunk = plan.microbatches // self.schedule.directions
        for prm in self._params.values():
            prm.meta["accumulations"] = per_chunk
        if self.schedule.directions == 2:
            ctx.groups["pp_mirror"] = mirror_group(ctx)
            for prm in self._params.values():
                if "pp_mirror" not in prm.replicated_over:
                    prm.replicated_over.append("pp_mirror")
        self.dtype = next(iter(self._params.values())).data.dtype
        self.fb_order = "parts" if plan.fb_overlap else "forward-first"    # or "alternate": see _Step._FB
        self.fb_fill = True   # fb_overlap: W parts fill where a part would wait on an all-to-all (parts.run_pair)
        if plan.fb_overlap:   # the all-to-alls a pair hides: posted by the comm thread, counts sent early
            overlap_all_to_alls([layer for ch in self.chunks for layer in ch.layers])
        self._pair_orders = {}             # (forward chunk, backward chunk) -> kernels.pp.fb_order.pair_order
        # RECVs of the next `recv_ahead` computes are posted before the current one runs, so a peer's tensor
        # lands while this rank computes instead of after it asks (0: each RECV where the schedule puts it)
        self.recv_ahead = 1
        self.compute_pos = [i for i, a in enumerate(self.actions) if a.kind in COMPUTE_KINDS]   # list positions
        self.compute_order = {i: j for j, i in enumerate(self.compute_pos)}                    # position -> j

    # ---------------------------------------------------------------- runner interface
    def params(self) -> dict:
        return dict(self._params)

    def shard_sequence(self, t):
        """This rank's tokens of a [batch, seq] tensor: its cp piece, or all of them."""
        return sequence_shard(t, self.ctx) if self.plan.cp > 1 else t

    def owns_loss(self) -> bool:
        """Ranks holding a head (the loss) or an MoE block (its aux loss); tp rank 0 only."""
        holds = any(ch.last or any(isinstance(lay, Block) and getattr(lay.mlp, "is_moe", False)
                                   for lay in ch.layers) for ch in self.chunks)
        return holds and self.ctx.coords["tp"] == 0

    def role(self) -> str:
        s = self.schedule
        parts = [f"stage {ch.stage}" + (f" dir {ch.index}" if s.directions == 2 else "") + f" ({ch.block_range()}"
                 + (", embed" if ch.first else "") + (", head" if ch.last else "") + ")" for ch in self.chunks]
        return f"pp rank {self.rank} of {s.pp}, {s.name} over {s.stages} stages: " + "; ".join(parts)

    # ---------------------------------------------------------------- one step
    def forward_backward(self, ids, targets, denom, hooks):
        run = _Step(self, ids.chunk(self.plan.microbatches), targets.chunk(self.plan.microbatches), denom,
                    hooks or LayerHooks())
        acts, computes = self.actions, self.compute_order
        posted = 0                                            # RECVs are posted in list order: FIFO per channel
        for i, a in enumerate(acts):
            if a.kind in COMPUTE_KINDS:
                j = computes[i] + self.recv_ahead             # post the RECVs of the next computes too
                posted = run.post_recvs(acts, posted, self.compute_pos[j] if j < len(computes) else len(acts))
                run.do(a)
            elif a.kind in ("RECV_F", "RECV_B"):
                posted = run.post_recvs(acts, posted, i + 1)
            else:
                run.do(a)
        run.finish()
        return run.loss, run.spans

    def pair_order(self, chunk: int, chunk2: int) -> list:
        """The parts of an overlapped pair of (forward chunk, backward chunk) in the order they run."""
        if (chunk, chunk2) not in self._pair_orders:
            self._pair_orders[(chunk, chunk2)] = chunk_pair_order(self.chunks[chunk], self.chunks[chunk2])
        return self._pair_orders[(chunk, chunk2)]

    def act_shape(self, ids_mb) -> tuple:
        """Shape of the tensor crossing a stage boundary for one microbatch: [b, s, dim]."""
        b, s = ids_mb.shape
        if self.plan.sp:                                     # sequence parallel keeps activations seq-sharded
            s //= self.plan.tp
        return (b, s, self.ctx.cfg.dim)


class _Step:
    """State of one step on one rank: in-flight p2p, saved contexts, the weight-grad queue."""

    def __init__(self, runner: PipelineRunner, ids, targets, denom, hooks):
        self.r, self.s = runner, runner.schedule
        self.ids, self.targets, self.denom, self.hooks = ids, targets, denom, hooks
        self.inbox = {}       # (kind, mb, chunk) -> recv Handle
        self.local = {}       # (kind, mb, chunk) -> tensor handed over between two chunks of this rank
        self.sent = set()     # (kind, mb, chunk) whose send is posted
        self.sends = []       # send Handles, waited at the end of the step
        self.saved = {}       # (mb, chunk) -> forward contexts until its backward
        self.w_queue = {}     # (mb, chunk) -> contexts of a split backward whose W is pending
        self.carry = []       # fb_overlap: an F&B pair's last W parts, left as filler for the next pair
        self.loss, self.spans = 0.0, []

    # ---- data movement
    def _peer(self, pp_rank: int) -> int:
        return self.r.group.global_rank(pp_rank)

    def post_recvs(self, acts, start: int, stop: int) -> int:
        """Post the irecv of every RECV in acts[start:stop]; returns the new posting frontier."""
        for a in acts[start:stop]:
            if a.kind in ("RECV_F", "RECV_B"):
                kind = a.kind[-1]
                buf = torch.empty(self.r.act_shape(self.ids[a.mb]), dtype=self.r.dtype)   # [b, s, dim]
                self.inbox[(kind, a.mb, a.chunk)] = comm.irecv(buf, self._peer(a.peer), self.r.group, TAG[kind])
        return max(start, stop)

    def do(self, a) -> None:
        if a.kind in ("SEND_F", "SEND_B"):
            key = (a.kind[-1], a.mb, a.chunk)
            assert key in self.sent, f"{a}: its producer did not post the send"
            self.sent.discard(key)
        else:
            t0 = events.now_ns()
            if a.kind != "FB":
                run_carried(self.carry)                               # before any other compute: in order
            getattr(self, "_" + a.kind)(a)
            self.spans.append((t0, events.now_ns()))

    def _input(self, mb: int, ch) -> torch.Tensor:
        if ch.first:
            return self.ids[mb]                                       # [b, s] token ids
        src, _ = self.s.holder(ch.stage - 1, mb)
        if src == self.r.rank:
            return self.local.pop(("F", mb, ch.index))
        return self.inbox.pop(("F", mb, ch.index)).wait()             # [b, s, dim]

    def _grad_in(self, mb: int, ch):
        if ch.last:
            return None                                               # the head starts from d(loss) = 1
        src, _ = self.s.holder(ch.stage + 1, mb)
        if src == self.r.rank:
            return self.local.pop(("B", mb, ch.index))
        return self.inbox.pop(("B", mb, ch.index)).wait()             # [b, s, dim]

    def _deliver(self, kind: str, mb: int, ch, t) -> None:
        """Send an activation (kind F) to the next stage or a gradient (B) to the previous, or hand it over."""
        dst, dst_chunk = self.s.holder(ch.stage + 1 if kind == "F" else ch.stage - 1, mb)
        if dst == self.r.rank:
            self.local[(kind, mb, dst_chunk)] = t
            return
        for h in [h for h in self.sends if h.is_completed()]:        # a finished send frees its tensor; its
            h.wait()                                                  # wait() is instant and logs completion
            self.sends.remove(h)
        self.sends.append(comm.isend(t.contiguous(), self._peer(dst), self.r.group, TAG[kind]))
        self.sent.add((kind, mb, ch.index))

    def _forward_done(self, mb, ch, result) -> None:
        y, ctxs, aux = result
        self.saved[(mb, ch.index)] = ctxs
        self.loss = self.loss + float(aux)
        if ch.last:
            self.loss = self.loss + float(y)
        else:
            self._deliver("F", mb, ch, y)

    def _backward_done(self, mb, ch, dx, ctxs, split: bool) -> None:
        if split:
            self.w_queue[(mb, ch.index)] = ctxs
        if not ch.first:
            self._deliver("B", mb, ch, dx)

    def _args(self, mb, chunk) -> dict:
        return dict(mb=mb, chunk=chunk, stage=self.r.chunks[chunk].stage)

    # ---- compute actions
    def _F(self, a) -> None:
        ch = self.r.chunks[a.chunk]
        with events.span(f"F mb{a.mb} c{a.chunk}", "F", **self._args(a.mb, a.chunk)):
            x = self._input(a.mb, ch)
            self._forward_done(a.mb, ch, drive(forward_steps(ch, x, self.targets[a.mb], self.denom, self.hooks)))

    def _backward(self, a, split: bool) -> None:
        ch = self.r.chunks[a.chunk]
        cat = "B" if split else "BW"
        with events.span(f"{cat} mb{a.mb} c{a.chunk}", "B", full=not split, **self._args(a.mb, a.chunk)):
            dy = self._grad_in(a.mb, ch)
            ctxs = self.saved.pop((a.mb, a.chunk))
            dx = drive(backward_steps(ch, ctxs, dy, not split, self.hooks))
            self._backward_done(a.mb, ch, dx, ctxs, split)

    def _B(self, a) -> None:
        self._backward(a, split=True)

    def _BW(self, a) -> None:
        self._backward(a, split=False)

    def _W(self, a) -> None:
        assert (a.mb, a.chunk) in self.w_queue, f"{a}: no backward-input queued its weight grad"
        with events.span(f"W mb{a.mb} c{a.chunk}", "W", **self._args(a.mb, a.chunk)):
            weight_grads(self.r.chunks[a.chunk], self.w_queue.pop((a.mb, a.chunk)))

    def _FB(self, a) -> None:
        """Forward of (mb, chunk) and full backward of (mb2, chunk2) as one pair; each side's tensor is sent the
        moment that side ends, so its transfer runs under the other side's compute. `fb_order` "forward-first"
        runs the forward's layers, posts its send, then the backward's (whose input had the forward's time to
        arrive); "alternate" takes one layer of each in turn, which pays off only when layers have async comm
        of their own to hide (on one compute stream it delays the forward's send by the backward's compute);
        "parts" (fb_overlap) interleaves DeepSeek's parts of both sides: see _fb_parts."""
        fch, bch = self.r.chunks[a.chunk], self.r.chunks[a.chunk2]
        alternate = self.r.fb_order == "alternate"
        with events.span(f"FB mb{a.mb} c{a.chunk} / mb{a.mb2} c{a.chunk2}", "FB", mb=a.mb, chunk=a.chunk,
                         stage=fch.stage, mb2=a.mb2, chunk2=a.chunk2, stage2=bch.stage):
            if self.r.fb_order == "parts":
                self._fb_parts(a, fch, bch)
                return
            fwd = forward_steps(fch, self._input(a.mb, fch), self.targets[a.mb], self.denom, self.hooks)
            bwd, ctxs = None, self.saved.pop((a.mb2, a.chunk2))
            forward_turn = True
            while fwd is not None or ctxs is not None:
                if fwd is not None and (ctxs is None or forward_turn or not alternate):
                    try:
                        next(fwd)
                    except StopIteration as stop:
                        self._forward_done(a.mb, fch, stop.value)
                        fwd = None
                else:
                    if bwd is None:                                  # its input is waited only now
                        bwd = backward_steps(bch, ctxs, self._grad_in(a.mb2, bch), True, self.hooks)
                    try:
                        next(bwd)
                    except StopIteration as stop:
                        self._backward_done(a.mb2, bch, stop.value, ctxs, split=False)
                        bwd = ctxs = None
                forward_turn = not forward_turn

    def _fb_parts(self, a, fch, bch) -> None:
        """The pair in kernels.pp.fb_order's order (kernels.pp.parts.run_pair). Both pipeline inputs are waited
        first (their RECVs were posted a compute ahead), so no pipeline wait sits between an all-to-all's issue
        and the part that hides it; each side's output is sent the moment its last input part is done."""
        fwd = ForwardParts(fch, self._input(a.mb, fch), self.targets[a.mb], self.denom, self.hooks)
        bwd = BackwardParts(bch, self.saved.pop((a.mb2, a.chunk2)), self._grad_in(a.mb2, bch), self.hooks)
        run_pair(self.r.pair_order(a.chunk, a.chunk2), fwd, bwd,
                 {"F": self._args(a.mb, a.chunk), "B": self._args(a.mb2, a.chunk2)},
                 lambda: self._forward_done(a.mb, fch, fwd.result()),
                 lambda: bch.first or self._deliver("B", a.mb2, bch, bwd.dx), fill=self.r.fb_fill,
                 carry=self.carry if self.r.fb_fill else None)

    # ---- end of step
    def finish(self) -> None:
        run_carried(self.carry)
        comm.wait_all(self.sends)
        assert not self.w_queue, f"weight-grad queue not empty at step end: {sorted(self.w_queue)}"
        assert not self.saved and not self.inbox and not self.local and not self.sent, \
            f"pipeline state left over at step end: saved {sorted(self.saved)}, recvs {sorted(self.inbox)}, " \
            f"local {sorted(self.local)}, unsent {sorted(self.sent)}"
