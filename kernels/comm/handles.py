"""Handles of in-flight comm ops and the always-on op log (no torch.distributed here).

A `Handle`'s completion time is taken when its future completes (in gloo's thread), or at
`wait()` for work without a future (gloo's p2p); `OpLog` keeps every op's issue / complete /
wait times since the last clear, so overlap can be measured without a tracer.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from kernels.comm import emulate, events
from kernels.comm.flight import recorder as flight


@dataclass
class OpRecord:
    op_id: int
    op: str
    group: str
    nbytes: int
    peer: int | None
    t_issue: int
    t_complete: int | None = None
    wait_ns: int = 0
    waits: list | None = None  # [(t0, t1)] the caller blocked on this op (not compute time)
    hold: object = None        # its place on an emulated link (kernels.comm.emulate.Hold)
    post: tuple | None = None  # (t0, t1) the caller spent posting it (not compute time)
    tag: int = 0               # a p2p op's tag (its pair on the peer has the same)
    # its identity and place (kernels.comm.flight): the same Seq / Comms Id on every rank of the op
    seq: int = 0
    comms_id: int = 0
    step: int = 0
    span: str | None = None    # the compute span running when it was issued
    shapes: tuple = ()         # each tensor's shape as given (a wrong size shows here)
    dtypes: tuple = ()         # each tensor's dtype name
    ranks: tuple = ()          # the group's member ranks (global)
    slot: int = -1             # its row in the flight recorder's shared mirror (-1: none)


class OpLog:
    """Every op's issue and completion time since the last `clear()`; always on, a few ns an op."""

    def __init__(self):
        self.records: list[OpRecord] = []
        self._lock = threading.Lock()

    def add(self, rec: OpRecord) -> None:
        with self._lock:
            self.records.append(rec)

    def clear(self) -> list[OpRecord]:
        with self._lock:
            out, self.records = self.records, []
        return out


oplog = OpLog()


class Handle:
    """An in-flight op. `wait()` blocks until done and returns the output tensor(s)."""

    def __init__(self, rec: OpRecord, work, result, future: bool = True):
        """future=False: the work has none (gloo's p2p), so completion is seen at wait(); asking
        would cost a C++ exception, ~0.1 ms an op."""
        self.rec, self._work, self.result = rec, work, result
        self._done = work is None
        if work is not None and future:
            try:
                fut = work.get_future()
            except RuntimeError:  # no future after all: completion is seen at wait()
                fut = None
            if fut is not None:
                fut.add_done_callback(self.mark_complete)
        if work is not None:
            rec.post = (rec.t_issue, events.now_ns())  # the caller's time posting it
            r = events.recorder()
            if r is not None and hasattr(r, "comm_posted"):
                r.comm_posted(rec.op_id, *rec.post)
            events.mark(f"posted {rec.op}", "posted", rec.post[1], op_id=rec.op_id)

    def mark_complete(self, _fut=None) -> None:
        """The data is in place: take the completion time (a future's callback, or whoever ran
        the op, e.g. a hand collective's lane, before any waiter wakes)."""
        t = emulate.completion(self.rec.hold, self.rec.t_issue, events.now_ns())
        if self.rec.t_complete is not None:  # wait() saw it first
            return
        self.rec.t_complete = t
        flight.completed(self.rec)
        rec = events.recorder()
        if rec is not None and hasattr(rec, "comm_complete"):
            rec.comm_complete(self.rec.op_id, t)
        events.mark(f"done {self.rec.op}", "done", t, op_id=self.rec.op_id)

    def is_completed(self) -> bool:
        if self._done:
            return True
        if not self._work.is_completed():
            return False
        held = emulate.completion(self.rec.hold, self.rec.t_issue, None)
        return held is None or held <= events.now_ns()

    def wait(self):
        if not self._done:
            t0 = events.now_ns()
            flight.waiting = (t0, self.rec)   # what the watcher publishes if this never returns
            try:
                with events.region(f"wait {self.rec.op}", "wait", op_id=self.rec.op_id) as region:
                    self._work.wait()
                    # an emulated link holds the op to its modelled end (gloo's own end, if known)
                    held = emulate.completion(self.rec.hold, self.rec.t_issue, None)
                    if held is not None:
                        emulate.sleep_until(held)
            finally:
                flight.waiting = None
            t1 = events.now_ns()
            region.update(t_ns=t0, t_end_ns=t1)  # the profile's wait is the recorder's, exactly
            rec = events.recorder()
            if self.rec.t_complete is None:  # no future, or its callback not yet run: done now
                self.rec.t_complete = t1 if held is None else held
                flight.completed(self.rec)
                if rec is not None and hasattr(rec, "comm_complete"):
                    rec.comm_complete(self.rec.op_id, self.rec.t_complete)
                events.mark(f"done {self.rec.op}", "done", self.rec.t_complete,
                            op_id=self.rec.op_id)
            self.rec.wait_ns += t1 - t0
            self.rec.waits = (self.rec.waits or []) + [(t0, t1)]
            if rec is not None and hasattr(rec, "comm_wait"):
                rec.comm_wait(self.rec.op_id, t0, t1)
            self._done = True
        return self.result


class AvgHandle(Handle):
    """An all-reduce average: sum on the wire, divide once at wait."""

    def __init__(self, rec, work, t, n):
        super().__init__(rec, work, t)
        self._n, self._divided = n, False

    def wait(self):
        super().wait()
        if not self._divided:
            self.result.div_(self._n)
            self._divided = True
        return self.result
