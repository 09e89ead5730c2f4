"""One replay core: ops in per-lane program order, with durations, cross-lane dependencies and
collective groups, replayed as one event loop into each op's start and end.

Its clients: the pipeline simulator (planning/pipeline/simulate.py: a lane per pp rank, computes and
posts), the trace what-if (partui/analysis/replay/whatif.py: a lane per rank, busy stretches, comm issues
and waits on the emulated link), and a cross-rank op graph of a real job (lanes per rank and
stream). It sits at kernels/ top level, torch-free, because none of them owns it.

Rules. A lane runs its ops in order from its start time; the time it gets to an op is `reached`.
    holds=True   the op occupies its lane: start = max(reached, its dependencies, its group's
                 last arrival), end = start + dur (or finish(start)); the lane goes on at the end.
    holds=False  async: the lane goes on at once (reached); the op starts when its dependencies
                 and group allow. eager: settled as soon as it can be; else only when a dependent
                 needs its end (a stateful `finish`, e.g. port sharing, then sees ops in the
                 order they are waited on); an async op no one needed keeps end None.
    Dep(op, lag, at)   start >= op's end (at="end") or start (at="start") + lag.
    group        ops sharing a group id start together at the last member's arrival (its reached);
                 group_size: how many members to wait for (default: every op given with that id).
    floor        the op lasts at least this long from `reached` (a wait no shorter than recorded).
Lanes are visited in the order they first appear, each run until it blocks, until none moves;
lanes left blocked raise Stuck naming what each waits for.

Each op records its cause: the one candidate its start took its value from, ("lane", previous
holding op or None at the lane's start) | ("dep", op id) | ("group", the last member to arrive),
so `Replay.critical_path` walks a chain of ops back from any op.

Batched: `pick` compares two times (default: plain numbers). Given an elementwise one, durations
may be vectors, one column per duration set (what-if scenarios of one graph): the event loop's
order does not depend on the values, so one pass replays every column; causes follow column 0.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Hashable


@dataclass(frozen=True, slots=True)
class Dep:
    op: Hashable
    lag: float = 0.0
    at: str = "end"                     # "end" | "start" of op


@dataclass(slots=True)
class Op:
    id: Hashable
    lane: Hashable
    dur: float = 0.0
    after: tuple = ()                   # Deps
    group: Hashable | None = None
    group_size: int | None = None
    holds: bool = True
    eager: bool = True
    finish: Callable[[float], float] | None = None   # end from start, in place of start + dur
    floor: float = 0.0


@dataclass(slots=True)
class Timed:
    reached: float
    lane_prev: Hashable | None          # the holding op before it on its lane (None: lane start)
    start: float | None = None
    end: float | None = None
    cause: tuple | None = None          # ("lane" | "dep" | "group", op id or None)


class Stuck(ValueError):
    """Lanes that cannot go on: blocked {lane: (op id, ("dep", op id) | ("group", group id))}."""

    def __init__(self, blocked: dict):
        self.blocked = blocked
        super().__init__("; ".join(f"lane {lane} at {op} waits for {what[0]} {what[1]}"
                                   for lane, (op, what) in blocked.items()))


@dataclass
class Replay:
    ops: dict                           # op id -> Timed, for every op a lane reached
    lane_end: dict = field(default_factory=dict)   # lane -> its clock after its last op

    def critical_path(self, op_id) -> list:
        """The ops whose times set op_id's start, back to a lane's start, first to last."""
        path, i, via_reach = [op_id], op_id, False
        while True:
            t = self.ops[i]
            kind, j = ("lane", t.lane_prev) if via_reach else t.cause
            if j is None:
                return path[::-1]
            via_reach = kind == "group"     # a member arrived when its lane reached it
            if j != i:
                path.append(j)
            i = j


@contextmanager
def gc_paused():
    """The cyclic collector off while a graph is built and replayed: 10^5 ops make millions of
    small acyclic objects it would rescan again and again (measured: 2x a pp 64 x 512 replay)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def later(current, candidate) -> tuple:
    """(the later time, whether the candidate is it): scalar times."""
    return (candidate, True) if candidate > current else (current, False)


def run(ops: list[Op], starts: dict | None = None, pick=later) -> Replay:
    """Replay `ops` (each lane's in program order); starts: lane -> start time (default 0);
    pick: how two times compare (`later`; an elementwise one replays vector durations)."""
    with gc_paused():
        return _run(ops, starts, pick)


def _run(ops: list[Op], starts: dict | None, pick) -> Replay:
    lanes: dict = {}
    by_id: dict = {}
    need: dict = {}
    for op in ops:
        if op.id in by_id:
            raise ValueError(f"op id {op.id!r} given twice: every op needs its own id")
        by_id[op.id] = op
        lanes.setdefault(op.lane, []).append(op)
        if op.group is not None:
            need[op.group] = need.get(op.group, 0) + 1
    given = dict(need)                  # group id -> how many ops carry it
    for op in ops:
        if op.group is not None and op.group_size is not None:
            need[op.group] = op.group_size
    starts = starts or {}
    clock = {lane: starts.get(lane, 0.0) for lane in lanes}
    last = {lane: None for lane in lanes}
    pc = {lane: 0 for lane in lanes}
    timed: dict = {}
    arrived: dict = {}                  # group id -> [(reached, op id)]
    last_arrival: dict = {}             # group id -> (last arrival, its member), once complete
    asking: set = set()                 # ops whose start is being worked out (a cycle's guard)

    def dep_time(d: Dep):
        if d.op not in timed:
            return None
        t = start_of(d.op) if d.at == "start" else end_of(d.op)
        return None if t is None else t + d.lag

    def start_of(i):
        t = timed[i]
        if t.start is None:
            if i in asking:
                return None                     # it waits, through others, on itself: a cycle
            op = by_id[i]
            start, cause = t.reached, ("lane", t.lane_prev)    # the first candidate wins ties
            asking.add(i)
            try:
                ats = []
                for d in op.after:
                    at = dep_time(d)
                    if at is None:
                        return None
                    ats.append(at)
            finally:
                asking.discard(i)
            for d, at in zip(op.after, ats):
                start, won = pick(start, at)
                if won:
                    cause = ("dep", d.op)
            if op.group is not None:
                last = group_last(op.group)
                if last is None:
                    return None
                start, won = pick(start, last[0])
                if won:
                    cause = ("group", last[1])
            t.start, t.cause = start, cause
        return t.start

    def group_last(g):
        """(the last arrival, the first member to arrive then), once every member arrived:
        reduced once per group, so a member's start costs O(1) however large its group (the
        same time and cause as comparing each arrival in turn, first one winning ties)."""
        if g in last_arrival:
            return last_arrival[g]
        got = arrived[g]
        if len(got) < need[g]:
            return None
        at, who = got[0]
        for t, w in got[1:]:
            at, won = pick(at, t)
            if won:
                who = w
        if len(got) == given[g]:        # no member left to arrive: the answer is final
            last_arrival[g] = (at, who)
        return at, who

    def end_of(i):
        t = timed[i]
        if t.end is None:
            start = start_of(i)
            if start is None:
                return None
            op = by_id[i]
            end = op.finish(start) if op.finish is not None else start + op.dur
            t.end = pick(end, t.reached + op.floor)[0]
        return t.end

    moved = True
    while moved:
        moved = False
        for lane, seq in lanes.items():
            while pc[lane] < len(seq):
                op = seq[pc[lane]]
                if op.id not in timed:
                    now = clock[lane]
                    if op.holds and not op.after and op.group is None and op.finish is None:
                        end = pick(now + op.dur, now + op.floor)[0]     # nothing to wait for
                        timed[op.id] = Timed(now, last[lane], now, end, ("lane", last[lane]))
                        clock[lane], last[lane] = end, op.id
                        pc[lane] += 1
                        moved = True
                        continue
                    timed[op.id] = Timed(now, last[lane])
                    if op.group is not None:
                        arrived.setdefault(op.group, []).append((now, op.id))
                if op.holds:
                    if end_of(op.id) is None:
                        break                           # blocked: try the other lanes
                    clock[lane], last[lane] = timed[op.id].end, op.id
                elif op.eager:
                    end_of(op.id)
                pc[lane] += 1
                moved = True

    def waits_for(op):
        miss = [("dep", d.op) for d in op.after if dep_time(d) is None]
        return op.id, miss[0] if miss else ("group", op.group)

    blocked = {lane: waits_for(seq[pc[lane]]) for lane, seq in lanes.items() if pc[lane] < len(seq)}
    unsettled = [op for op in ops if not op.holds and op.eager and op.id in timed
                 and timed[op.id].end is None and end_of(op.id) is None]
    blocked.update({op.lane: waits_for(op) for op in unsettled if op.lane not in blocked})
    if blocked:
        raise Stuck(blocked)
    return Replay(timed, clock)
