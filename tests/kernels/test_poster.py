"""The comm thread that posts a marked group's ops (kernels/comm/poster.py): the caller returns
before the op is posted, ops keep their issue order, an error comes back at wait, and on two
ranks every posted all-to-all moves the right rows with its issue and completion recorded."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from kernels import comm
from kernels.comm import events
from kernels.comm.poster import PostedWork, launch, post_from_thread
from worlds import run_world


class _Work:
    def __init__(self, log=None, tag=None):
        self.log, self.tag = log, tag

    def wait(self):
        return True

    def is_completed(self):
        return True

    def get_future(self):
        raise RuntimeError("no future")


def _marked():
    g = SimpleNamespace(size=2, posted=False)
    post_from_thread(g)
    return g


def test_a_group_of_one_is_never_marked_and_unmarked_groups_post_in_place():
    one = SimpleNamespace(size=1, posted=False)
    post_from_thread(one)
    assert not one.posted
    w = _Work()
    assert launch(one, lambda: w) is w           # posted here, by the caller


def test_the_caller_returns_before_the_op_is_posted():
    release, where = threading.Event(), []

    def post():
        release.wait(10)
        where.append(threading.current_thread().name)
        return _Work()

    work = launch(_marked(), post)
    assert isinstance(work, PostedWork)
    assert not work.is_completed() and where == []   # still not posted: the caller went on
    release.set()
    assert work.wait() is True
    assert where == ["partui-comm-post"]


def test_ops_are_posted_in_issue_order():
    g, order = _marked(), []
    works = [launch(g, lambda i=i: order.append(i) or _Work()) for i in range(50)]
    for w in works:
        w.wait()
    assert order == list(range(50))


def test_an_error_while_posting_is_raised_at_wait():
    def post():
        raise ValueError("bad splits")
    work = launch(_marked(), post)
    with pytest.raises(ValueError, match="bad splits"):
        work.wait()


class _Rec:
    def __init__(self):
        self.issue, self.complete, self.posted = {}, {}, {}

    def compute(self, *a):
        pass

    def comm_issue(self, op_id, op, group, nbytes, peer, t_ns, args):
        self.issue[op_id] = t_ns

    def comm_complete(self, op_id, t_ns):
        self.complete.setdefault(op_id, t_ns)

    def comm_posted(self, op_id, t0, t1):
        self.posted[op_id] = (t0, t1)

    def comm_wait(self, *a):
        pass


def _posted_all_to_all(rank, size):
    group = comm.new_groups("ep", [list(range(size))])
    post_from_thread(group)
    rec = _Rec()
    events.set_recorder(rec)
    handles, want = [], []
    for n in range(1, 21):                              # 20 ops of different sizes in flight
        inp = torch.arange(2 * n, dtype=torch.float64) + 1000 * rank + 100 * n    # [2n]
        out = torch.empty(2 * n, dtype=torch.float64)
        handles.append(comm.all_to_all_single(out, inp, group, [n, n], [n, n], async_op=True))
        peer = torch.arange(2 * n, dtype=torch.float64) + 1000 * (1 - rank) + 100 * n
        mine = torch.arange(2 * n, dtype=torch.float64) + 1000 * rank + 100 * n
        want.append(torch.cat([mine[:n], peer[:n]] if rank == 0 else [peer[n:], mine[n:]]))
    got = [h.wait() for h in handles]
    events.set_recorder(None)
    ok = all(torch.equal(g, w) for g, w in zip(got, want))
    timed = all(rec.complete.get(i, -1) >= t for i, t in rec.issue.items())
    return ok, timed, len(rec.issue), len(rec.posted)


def test_posted_all_to_alls_on_two_ranks_move_the_right_rows():
    for ok, timed, issued, posted in run_world(2, _posted_all_to_all, timeout_s=120):
        assert ok, "a posted all-to-all returned the wrong rows (out of order?)"
        assert timed, "an op's completion was recorded before its issue, or not at all"
        assert issued == posted == 20
