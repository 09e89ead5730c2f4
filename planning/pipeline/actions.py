"""Pipeline schedules as data: the Action a pp rank runs and the Schedule holding every rank's list,
with the SEND / RECV transfers that go around the computes (planning/pipeline/schedules.py builds the
lists; its docstring gives the stages, chunks and execution semantics).

Action kinds: "F" forward; "B" backward-input (only when split_w: its weight grad "W" comes later);
"BW" full backward (B then W at once); "FB" an overlapped pair: forward of (mb, chunk) with full
backward of (mb2, chunk2); "SEND_F"/"RECV_F" activations, "SEND_B"/"RECV_B" input gradients,
`peer` = the other pp rank. A RECV sits right before the compute that consumes it, a SEND right
after the compute that produced it; a hand-off between two chunks of one rank has neither.
"""
from __future__ import annotations

from dataclasses import dataclass, field

COMPUTE_KINDS = ("F", "B", "W", "BW", "FB")
COMM_KINDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")


@dataclass(frozen=True)
class Action:
    kind: str                  # one of COMPUTE_KINDS + COMM_KINDS
    mb: int                    # microbatch index
    chunk: int = 0             # local model chunk on this rank, 0..v-1
    peer: int | None = None    # send/recv: the other pp rank
    mb2: int | None = None     # FB: the backward's microbatch
    chunk2: int | None = None  # FB: the backward's chunk

    def __str__(self) -> str:
        s = f"{self.kind}(mb {self.mb}, chunk {self.chunk}"
        if self.peer is not None:
            s += f", peer {self.peer}"
        if self.kind == "FB":
            s += f"; backward mb {self.mb2}, chunk {self.chunk2}"
        return s + ")"


@dataclass
class Schedule:
    name: str
    pp: int
    microbatches: int
    stages: int                               # stages of one pipeline (direction)
    chunks_per_rank: int
    stage_table: tuple[tuple[int, ...], ...]  # [rank][chunk] -> stage
    actions: list[list[Action]]
    split_w: bool
    directions: int = 1                       # 2 for dualpipe: chunk d carries direction d's microbatches
    cost_scale: float = 1.0                   # share of a rank's layers in one chunk (interleaved: 1/v)
    _holders: dict = field(default_factory=dict, repr=False, compare=False)

    def stage_of(self, rank: int, chunk: int) -> int:
        return self.stage_table[rank][chunk]

    def direction_of(self, mb: int) -> int:
        """Which pipeline a microbatch travels: always 0 but for dualpipe's second half of microbatches."""
        return 0 if self.directions == 1 else int(mb >= self.microbatches // 2)

    def chunk_direction(self, chunk: int) -> int:
        return 0 if self.directions == 1 else chunk

    def accumulations(self, rank: int, chunk: int) -> int:
        """How many times a step accumulates the weight grads of `chunk` on `rank`: once per W
        (a B only queues it), per BW, and per FB whose backward half (mb2, chunk2) is this chunk.
        Every schedule gives M, but DualPipe's M/2: a chunk carries one direction's half."""
        return sum(1 for a in self.actions[rank]
                   if (a.kind in ("W", "BW") and a.chunk == chunk)
                   or (a.kind == "FB" and a.chunk2 == chunk))

    def held_contexts(self, rank: int) -> int:
        """The most microbatch-chunk contexts `rank` holds at once, walking its actions as the
        executor runs them: a forward's are held until its W (a split B queues them for it) or its
        BW; an FB pair's forward keeps its contexts before its backward lets the other's go."""
        held = peak = 0
        for a in self.actions[rank]:
            if a.kind in ("F", "FB"):
                held += 1
                peak = max(peak, held)
            if a.kind in ("W", "BW", "FB"):
                held -= 1
        return peak

    def holder(self, stage: int, mb: int) -> tuple[int, int]:
        """(rank, chunk) that runs `stage` for microbatch `mb`."""
        if not self._holders:
            for r in range(self.pp):
                for c in range(self.chunks_per_rank):
                    self._holders[(self.stage_of(r, c), self.chunk_direction(c))] = (r, c)
        return self._holders[(stage, self.direction_of(mb))]


# ---------------------------------------------------------------- transfers

def forward_transfers(s: Schedule, rank: int, mb: int, chunk: int) -> tuple[list[Action], list[Action]]:
    """(recvs before, sends after) a forward of (mb, chunk) on rank."""
    stage = s.stage_of(rank, chunk)
    recvs, sends = [], []
    if stage > 0:
        src, _ = s.holder(stage - 1, mb)
        if src != rank:
            recvs.append(Action("RECV_F", mb, chunk, peer=src))
    if stage < s.stages - 1:
        dst, _ = s.holder(stage + 1, mb)
        if dst != rank:
            sends.append(Action("SEND_F", mb, chunk, peer=dst))
    return recvs, sends


def backward_transfers(s: Schedule, rank: int, mb: int, chunk: int) -> tuple[list[Action], list[Action]]:
    """(recvs before, sends after) a backward-input of (mb, chunk) on rank."""
    stage = s.stage_of(rank, chunk)
    recvs, sends = [], []
    if stage < s.stages - 1:
        src, _ = s.holder(stage + 1, mb)
        if src != rank:
            recvs.append(Action("RECV_B", mb, chunk, peer=src))
    if stage > 0:
        dst, _ = s.holder(stage - 1, mb)
        if dst != rank:
            sends.append(Action("SEND_B", mb, chunk, peer=dst))
    return recvs, sends


def add_transfers(s: Schedule) -> Schedule:
    """Put a RECV right before each compute that needs remote data and a SEND right after each producer."""
    out = []
    for rank, compute in enumerate(s.actions):
        seq = []
        for a in compute:
            recvs, sends = [], []
            if a.kind in ("F", "FB"):
                r, snd = forward_transfers(s, rank, a.mb, a.chunk)
                recvs += r
                sends += snd
            if a.kind in ("B", "BW"):
                recvs, sends = backward_transfers(s, rank, a.mb, a.chunk)
            if a.kind == "FB":
                r, snd = backward_transfers(s, rank, a.mb2, a.chunk2)
                recvs += r
                sends += snd
            seq += recvs + [a] + sends
        out.append(seq)
    s.actions = out
    return s
