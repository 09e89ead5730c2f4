"""The flight recorder: every rank's last N comm ops with their identity, and what it was doing.

Each op issued through the door (`kernels.comm.core.issue_op`) gets its identity here:
    Seq        1-based, per group on this rank for collectives; for p2p per (group, src -> dst, tag),
               so the k-th send a -> b and the k-th recv on b from a share a Seq (the pairing rule of
               planning.intervals.match_p2p)
    Comms Id   crc32 of the group name and Seq (and, for p2p, the direction and tag): the same on
               every rank taking part in the same op
and its OpRecord (issue / posted / completed times, shapes, dtypes) goes into a ring buffer of the
last `capacity` ops. Recording costs a deque append and a dict lookup (`partui bench flight`
measures it against the recorder off). No torch here: records hold shapes and dtype names.

Beside the ring: the rank's step, its current span (what its schedule is running), and the op it
is blocked on with the time it started waiting, which the rank's watcher publishes so the
controller can tell a world that stopped progressing from one that is slow.
"""
from __future__ import annotations

import collections
import threading
import time
import zlib

from planning.flight_codes import MIRROR_ROWS, T_COMPLETE, WIDTH, encode_into

CAPACITY = 512   # ops kept per rank (torch's TORCH_FR_BUFFER_SIZE plays the same part); a dump of
                 # 512 stays small enough to write and read within the 10 s a hang is named in
P2P_OPS = ("send", "recv")


def comms_id(group: str, seq: int, direction: str = "") -> int:
    """The op's identity across ranks: crc32 of 'group|seq' (p2p: 'group|src->dst:tag|seq')."""
    key = f"{group}|{direction}|{seq}" if direction else f"{group}|{seq}"
    return zlib.crc32(key.encode())


class FlightRecorder:
    """One rank's ring of OpRecords and its current place (step, span, wait)."""

    def __init__(self, capacity: int = CAPACITY):
        self.enabled = True
        self.ring: collections.deque = collections.deque(maxlen=capacity)
        self.seqs: dict = {}           # group (or (group, src, dst, tag)) -> last Seq issued
        self.groups: dict = {}         # group name -> its member ranks, as this rank knows them
        self.step = 0
        self.span: str | None = None   # the innermost compute span running now (kernels.comm.events)
        self.waiting = None            # (t_ns, OpRecord) the caller blocked on, or None
        self._lock = threading.Lock()  # issue may come from the comm thread too
        self.mirror, self.mirror_at, self.mirrored = None, 0, 0   # shared rows (planning.flight_codes)

    def attach_mirror(self, shared, at: int) -> None:
        """Mirror every op from now on into shared[at:] (planning.flight_codes.BLOCK; memory the
        controller owns, or a file's under torchrun): an int64 buffer (RawArray("q"), ctypes)."""
        self.mirror, self.mirror_at, self.mirrored = shared, at, 0
        # byte and int64 views of the same memory: a row packed in one call, fields read without
        # ctypes' per-item cost (partui bench flight)
        self._bytes = memoryview(shared).cast("B")
        self._q = self._bytes.cast("q")
        self._q[at] = 0

    def identify(self, rec, ranks, me: int) -> None:
        """Give rec its Seq and Comms Id, and keep it in the ring (rec.ranks: the group's)."""
        if rec.op in P2P_OPS and rec.peer is not None:
            src, dst = (me, rec.peer) if rec.op == "send" else (rec.peer, me)
            direction = f"{src}->{dst}:{rec.tag}"
            key = (rec.group, src, dst, rec.tag)
        else:
            direction, key = "", rec.group
        with self._lock:
            seq = self.seqs.get(key, 0) + 1
            self.seqs[key] = seq
            if rec.group not in self.groups:
                self.groups[rec.group] = list(ranks)
            rec.seq, rec.comms_id, rec.step = seq, comms_id(rec.group, seq, direction), self.step
            rec.span = self.span
            if self.enabled:
                self.ring.append(rec)
                if self.mirror is not None:
                    self._mirror(rec, ranks)

    def _mirror(self, rec, ranks) -> None:
        i = self.mirrored % MIRROR_ROWS
        self.mirrored += 1
        rec.slot = i
        at = self.mirror_at + 1 + i * WIDTH
        encode_into(self._bytes, 8 * at, rec.seq, rec.comms_id, rec.op, rec.group, rec.peer,
                    rec.tag, rec.step, rec.shapes, rec.dtypes, rec.t_issue, rec.t_complete,
                    ranks, rec.nbytes)
        self._q[self.mirror_at] = self.mirrored

    def completed(self, rec) -> None:
        """rec's completion time into its shared row, if the row is still rec's."""
        slot = rec.slot
        if slot >= 0 and self.mirror is not None:
            m = self._q
            at = self.mirror_at + 1 + slot * WIDTH
            if m[at + 1] == rec.comms_id and m[at] == rec.seq:
                m[at + T_COMPLETE] = rec.t_complete or 0

    def records(self) -> list:
        with self._lock:
            return list(self.ring)

    def clear(self) -> None:
        with self._lock:
            self.ring.clear()
            self.seqs.clear()

    def waiting_since(self) -> int:
        """perf_counter_ns when the caller began its current blocking wait; 0 when not waiting."""
        w = self.waiting
        return w[0] if w is not None else 0


recorder = FlightRecorder()


def record_dict(rec) -> dict:
    """One OpRecord as plain JSON: what `partui doctor` reads."""
    return {"seq": rec.seq, "comms_id": rec.comms_id, "op": rec.op, "group": rec.group,
            "ranks": list(rec.ranks or ()), "peer": rec.peer, "tag": rec.tag, "bytes": rec.nbytes,
            "shapes": [list(s) for s in rec.shapes or ()], "dtypes": list(rec.dtypes or ()),
            "step": rec.step, "span": rec.span, "t_issue": rec.t_issue,
            "t_posted": rec.post[1] if rec.post else None, "t_complete": rec.t_complete}


def dump(rank: int, now_ns: int) -> dict:
    """This rank's records and place, as plain JSON (the rank's part of a flight dump)."""
    fr = recorder
    waiting = fr.waiting
    # t_dump_wall beside t_dump: this rank's clock against wall time, so its records can be laid
    # beside torch's (partui doctor TORCH --with DUMP)
    return {"rank": rank, "step": fr.step, "span": fr.span, "t_dump": now_ns,
            "t_dump_wall": time.time_ns() - (time.perf_counter_ns() - now_ns),
            "waiting": None if waiting is None else {"since": waiting[0], "seq": waiting[1].seq,
                                                     "group": waiting[1].group,
                                                     "op": waiting[1].op},
            "groups": {g: list(r) for g, r in fr.groups.items()},
            "records": [record_dict(r) for r in fr.records()]}
