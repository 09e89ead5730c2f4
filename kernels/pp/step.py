"""One pipeline step on one pp rank (kernels/pp/executor.py runs it): the step's p2p and its
compute actions.

Data movement: a RECV posts an irecv into `inbox` and never blocks; a compute waits only for the
tensors it consumes; a tensor it produces for another rank is sent the moment it exists (the SEND
action after the compute only checks that it went), and sends are waited at the end of the step,
never before the next compute. Activations and input gradients travel on distinct tags (TAG), so
each (peer, kind) channel is a FIFO of its own. A hand-off between two chunks of this rank
(DualPipeV's turn on rank P-1) stays local.

Computes: F, B (backward-input; its W is queued), BW (full backward), W, and FB, an overlapped
pair (see PipelineStep._FB).
"""
from __future__ import annotations

import torch

from kernels import comm
from kernels.comm import events
from kernels.memory import HeldDict, account_of, saved_bytes
from kernels.pp.parts import BackwardParts, ForwardParts, run_carried, run_pair
from kernels.pp.stages import backward_steps, drive, forward_steps, weight_grads
from kernels.straggle import stretch

TAG = {"F": 7101, "B": 7102}   # activations and gradients: one FIFO channel each per peer


class PipelineStep:
    """State of one step on one rank: in-flight p2p, saved contexts, the weight-grad queue."""

    def __init__(self, runner, ids, targets, denom, hooks):
        self.r, self.s = runner, runner.schedule
        self.ids, self.targets, self.denom, self.hooks = ids, targets, denom, hooks
        self.memory = mem = account_of(runner.ctx.stats)   # holds what the dicts below hold
        self.inbox = HeldDict(mem, "comm", "recv", lambda h: saved_bytes(h.result))  # (kind, mb, chunk) -> recv Handle
        self.local = {}       # (kind, mb, chunk) -> tensor handed over between two chunks here
        self.sent = set()     # (kind, mb, chunk) whose send is posted
        self.sends = []       # send Handles, waited at the end of the step
        self.saved = HeldDict(mem, "activations", "saved")  # (mb, chunk) -> forward contexts until its backward
        self.w_queue = HeldDict(mem, "activations", "w")    # (mb, chunk) -> contexts of a split backward whose W is pending
        self.carry = []       # fb_overlap: a pair's last W parts, filler for the next pair
        self.loss = 0.0

    # ---- data movement
    def _peer(self, pp_rank: int) -> int:
        return self.r.group.global_rank(pp_rank)

    def post_recvs(self, acts, start: int, stop: int) -> int:
        """Post the irecv of every RECV in acts[start:stop]; returns the new posting frontier."""
        for a in acts[start:stop]:
            if a.kind in ("RECV_F", "RECV_B"):
                kind = a.kind[-1]
                shape = self.r.act_shape(self.ids[a.mb])
                buf = torch.empty(shape, dtype=self.r.dtype)                  # [b, s, dim]
                self.inbox[(kind, a.mb, a.chunk)] = comm.irecv(buf, self._peer(a.peer),
                                                               self.r.group, TAG[kind])
        return max(start, stop)

    def do(self, a) -> None:
        if a.kind in ("SEND_F", "SEND_B"):
            key = (a.kind[-1], a.mb, a.chunk)
            assert key in self.sent, f"{a}: its producer did not post the send"
            self.sent.discard(key)
        else:
            t0 = events.now_ns()
            self.memory.at(a)
            if a.kind != "FB":
                run_carried(self.carry)                  # before any other compute: in order
            getattr(self, "_" + a.kind)(a)
            stretch(t0, self.r.slow)

    def _input(self, mb: int, ch) -> torch.Tensor:
        if ch.first:
            return self.ids[mb]                                       # [b, s] token ids
        src, _ = self.s.holder(ch.stage - 1, mb)
        if src == self.r.rank:
            return self.local.pop(("F", mb, ch.index))
        return self.inbox.pop(("F", mb, ch.index)).wait()             # [b, s, dim]

    def _grad_in(self, mb: int, ch):
        if ch.last:
            return None                                   # the head starts from d(loss) = 1
        src, _ = self.s.holder(ch.stage + 1, mb)
        if src == self.r.rank:
            return self.local.pop(("B", mb, ch.index))
        return self.inbox.pop(("B", mb, ch.index)).wait()             # [b, s, dim]

    def _deliver(self, kind: str, mb: int, ch, t) -> None:
        """Send an activation (kind F) to the next stage or a gradient (B) to the previous, or
        hand it over to this rank's other chunk."""
        dst, dst_chunk = self.s.holder(ch.stage + 1 if kind == "F" else ch.stage - 1, mb)
        if dst == self.r.rank:
            self.local[(kind, mb, dst_chunk)] = t
            return
        for h in [h for h in self.sends if h.is_completed()]:   # a finished send frees its
            h.wait()                                              # tensor; wait() is instant
            self.sends.remove(h)
            self.memory.drop("comm", ("send", id(h)))
        t = t.contiguous()
        self.sends.append(comm.isend(t, self._peer(dst), self.r.group, TAG[kind]))
        self.memory.hold("comm", ("send", id(self.sends[-1])), saved_bytes(t))
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
            steps = forward_steps(ch, x, self.targets[a.mb], self.denom, self.hooks)
            self._forward_done(a.mb, ch, drive(steps))

    def _backward(self, a, split: bool) -> None:
        ch = self.r.chunks[a.chunk]
        cat = "B" if split else "BW"
        with events.span(f"{cat} mb{a.mb} c{a.chunk}", "B", full=not split,
                         **self._args(a.mb, a.chunk)):
            dy = self._grad_in(a.mb, ch)
            ctxs = self.saved[(a.mb, a.chunk)]     # held (and accounted) until its backward ends
            dx = drive(backward_steps(ch, ctxs, dy, not split, self.hooks))
            self.saved.pop((a.mb, a.chunk))
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
        """Forward of (mb, chunk) and full backward of (mb2, chunk2) as one pair; each side's
        tensor is sent the moment that side ends, so its transfer runs under the other side's
        compute. The runner's `fb_order`: "forward-first" runs the forward's layers, posts its
        send, then the backward's (whose input had the forward's time to arrive); "alternate"
        (partui bench pp --fb-order) takes one layer of each in turn, which pays off only when
        layers have async comm of their own to hide; "parts" (fb_overlap) interleaves DeepSeek's
        parts of both sides: see _fb_parts."""
        fch, bch = self.r.chunks[a.chunk], self.r.chunks[a.chunk2]
        with events.span(f"FB mb{a.mb} c{a.chunk} / mb{a.mb2} c{a.chunk2}", "FB", mb=a.mb,
                         chunk=a.chunk, stage=fch.stage, mb2=a.mb2, chunk2=a.chunk2,
                         stage2=bch.stage):
            if self.r.fb_order == "parts":
                self._fb_parts(a, fch, bch)
            else:
                self._fb_layers(a, fch, bch, alternate=self.r.fb_order == "alternate")

    def _fb_layers(self, a, fch, bch, alternate: bool) -> None:
        """The pair layer by layer: the forward's first (or one of each in turn)."""
        fwd = forward_steps(fch, self._input(a.mb, fch), self.targets[a.mb], self.denom,
                            self.hooks)
        bwd, ctxs = None, self.saved[(a.mb2, a.chunk2)]
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
                    dy = self._grad_in(a.mb2, bch)
                    bwd = backward_steps(bch, ctxs, dy, True, self.hooks)
                try:
                    next(bwd)
                except StopIteration as stop:
                    self.saved.pop((a.mb2, a.chunk2))
                    self._backward_done(a.mb2, bch, stop.value, ctxs, split=False)
                    bwd = ctxs = None
            forward_turn = not forward_turn

    def _fb_parts(self, a, fch, bch) -> None:
        """The pair in planning.pipeline.fb_order's order (kernels.pp.parts.run_pair). Both pipeline
        inputs are waited first (their RECVs were posted a compute ahead), so no pipeline wait
        sits between an all-to-all's issue and the part that hides it; each side's output is sent
        the moment its last input part is done. W parts fill where a part would wait on an
        all-to-all, and the pair's last W parts carry over as filler for the next compute."""
        fwd = ForwardParts(fch, self._input(a.mb, fch), self.targets[a.mb], self.denom,
                           self.hooks)
        bwd = BackwardParts(bch, self.saved[(a.mb2, a.chunk2)], self._grad_in(a.mb2, bch),
                            self.hooks)
        run_pair(self.r.pair_order(a.chunk, a.chunk2), fwd, bwd,
                 {"F": self._args(a.mb, a.chunk), "B": self._args(a.mb2, a.chunk2)},
                 lambda: self._forward_done(a.mb, fch, fwd.result()),
                 lambda: bch.first or self._deliver("B", a.mb2, bch, bwd.dx),
                 fill=True, carry=self.carry)
        self.saved.pop((a.mb2, a.chunk2))

    # ---- end of step
    def finish(self) -> None:
        run_carried(self.carry)
        comm.wait_all(self.sends)
        for h in self.sends:
            self.memory.drop("comm", ("send", id(h)))
        self.memory.at("step end")
        assert not self.w_queue, f"weight-grad queue not empty at step end: {sorted(self.w_queue)}"
        assert not self.saved and not self.inbox and not self.local and not self.sent, \
            f"pipeline state left over at step end: saved {sorted(self.saved)}, recvs " \
            f"{sorted(self.inbox)}, local {sorted(self.local)}, unsent {sorted(self.sent)}"
