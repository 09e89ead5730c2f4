"""Hand collectives (kernels.comm.collectives) against gloo's on real worlds of 2, 3 and 4 ranks,
on the world and on subgroups, for sizes 1, N-1, N and 1000003; their handles and traces; and
whole plans with --collectives hand."""
import time

import pytest
import torch

from conftest import check_plan
from kernels import comm
from kernels.comm import events
from kernels.comm.core import HAND_OPS, register_hand_collectives
from worlds import run_world

BIG = 1000003


def _both(fn):
    """fn() under native then hand collectives: (gloo's result, ours)."""
    comm.set_collectives("native")
    a = fn()
    comm.set_collectives("hand")
    try:
        b = fn()
    finally:
        comm.set_collectives("native")
    return a, b


def _split(i: int, j: int, scale: int) -> int:
    """Rows rank i sends rank j in the uneven all-to-all (some are 0)."""
    return ((3 * i + 5 * j) % 4) * scale


def _cases(g, rank: int) -> list[tuple[str, torch.Tensor, torch.Tensor, bool]]:
    """(name, gloo's, ours, exact) for every collective on group g."""
    n, me, out = g.size, g.rank, []
    gen = torch.Generator().manual_seed(1234 + rank)
    for m in sorted({1, n - 1, n, BIG}):
        x = torch.randn(m, generator=gen)                   # [m]
        for op in ("sum", "avg", "max", "min"):
            a, b = _both(lambda: comm.all_reduce(x.clone(), g, op))
            out.append((f"all_reduce {op} {m}", a, b, op in ("max", "min")))
        a, b = _both(lambda: comm.all_reduce(x.clone(), g, "sum", async_op=True).wait())
        out.append((f"all_reduce async {m}", a, b, False))
        big = torch.randn(n * m, generator=gen)             # [n * m]
        for op in ("sum", "avg", "max"):
            a, b = _both(lambda: comm.reduce_scatter(torch.empty(m), big, g, op))
            out.append((f"reduce_scatter {op} {m}", a, b, op == "max"))
        a, b = _both(lambda: comm.reduce_scatter(torch.empty(m), big, g, async_op=True).wait())
        out.append((f"reduce_scatter async {m}", a, b, False))
        a, b = _both(lambda: comm.all_gather(torch.empty(n * m), x, g))
        out.append((f"all_gather {m}", a, b, True))
        a, b = _both(lambda: comm.all_gather(torch.empty(n * m), x, g, async_op=True).wait())
        out.append((f"all_gather async {m}", a, b, True))
        for src in (g.ranks[0], g.ranks[-1]):
            a, b = _both(lambda: comm.broadcast(x.clone(), src, g))
            out.append((f"broadcast from {src} {m}", a, b, True))
        rows = torch.randn(n * m, 3, generator=gen)          # [n * m, 3] even split
        a, b = _both(lambda: comm.all_to_all_single(torch.empty(n * m, 3), rows, g))
        out.append((f"all_to_all even {m}", a, b, True))
    for scale in (1, BIG // 16):                            # uneven, zero-row pieces included
        ins = [_split(me, j, scale) for j in range(n)]
        outs = [_split(i, me, scale) for i in range(n)]
        x = torch.randn(sum(ins), 2, generator=gen)         # [rows sent, 2]
        a, b = _both(lambda: comm.all_to_all_single(torch.empty(sum(outs), 2), x, g, outs, ins))
        out.append((f"all_to_all uneven x{scale}", a, b, True))
        a, b = _both(lambda: comm.all_to_all_single(torch.empty(sum(outs), 2), x, g, outs, ins,
                                                    async_op=True).wait())
        out.append((f"all_to_all uneven async x{scale}", a, b, True))
    return out


def _compare(rank: int, size: int, partitions: list[list[list[int]]]) -> list[str]:
    """Every case on the world and on each partition's group of this rank; the mismatches."""
    torch.set_num_threads(1)
    groups = [comm.world_group()] + [comm.new_groups(f"sub{i}", p) for i, p in enumerate(partitions)]
    bad, count = [], 0
    for g in groups:
        if g.size == 1:
            continue
        for name, a, b, exact in _cases(g, rank):
            count += 1
            same = torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-5, atol=1e-6)
            if a.shape != b.shape or not same:
                bad.append(f"{g.name}{g.ranks} {name}: max diff "
                           f"{(a - b).abs().max().item() if a.shape == b.shape else 'shape'}")
    return [f"{count} cases"] + bad


@pytest.mark.timeout(400)
@pytest.mark.parametrize("world,partitions", [
    (2, []),
    (3, [[[0, 2], [1]]]),
    (4, [[[0, 2], [1, 3]], [[0, 1, 3], [2]]]),          # non-contiguous subgroups
])
def test_hand_equals_gloo(world, partitions):
    results = run_world(world, _compare, partitions, timeout_s=360)
    for rank, res in enumerate(results):
        assert int(res[0].split()[0]) > 40, res[0]
        assert res[1:] == [], f"rank {rank}: " + "\n".join(res[1:])


# ---------------------------------------------------------------- handles, tracing, errors

class _Recorder:
    def __init__(self):
        self.issues, self.complete, self.waits = {}, {}, []

    def comm_issue(self, op_id, op, group, nbytes, peer, t_ns, args):
        self.issues[op_id] = dict(op=op, group=group, nbytes=nbytes, peer=peer, t=t_ns, **args)

    def comm_complete(self, op_id, t_ns):
        self.complete[op_id] = t_ns

    def comm_wait(self, op_id, t0, t1):
        self.waits.append((op_id, t0, t1))


def _handles_and_trace(rank: int, size: int) -> dict:
    comm.set_collectives("hand")
    g = comm.world_group()
    # async: completion is when the ring finished, not when someone waited
    t = torch.full((1000,), float(rank))
    h = comm.all_reduce(t, g, async_op=True)
    time.sleep(0.5)
    t_wait = events.now_ns()
    assert isinstance(h, comm.Handle) and h.wait() is t
    early = h.rec.t_complete is not None and h.rec.t_complete < t_wait
    # several in flight, waited out of order
    ts = [torch.full((257 * k,), float(rank + k)) for k in (1, 2, 3)]
    hs = [comm.all_reduce(x, g, "max", async_op=True) for x in ts]
    in_flight = [x.wait().max().item() for x in reversed(hs)]
    # one traced op: outer span in the OpLog, ring steps for the recorder only
    rec = _Recorder()
    comm.oplog.clear()
    events.set_recorder(rec)
    comm.all_reduce(torch.ones(10), g)
    events.set_recorder(None)
    logged = [(r.op, r.nbytes) for r in comm.oplog.clear()]
    outer = [i for i, e in rec.issues.items() if "parent" not in e]
    inner = {i: e for i, e in rec.issues.items() if "parent" in e}
    errors = []
    for bad in (lambda: comm.reduce_scatter(torch.empty(3), torch.empty(5), g),
                lambda: comm.all_gather(torch.empty(5), torch.empty(3), g),
                lambda: comm.broadcast(torch.empty(3), 99, g),
                lambda: comm.all_to_all_single(torch.empty(4), torch.empty(4), g)):
        try:
            bad()
        except ValueError as e:
            errors.append(str(e))
    comm.set_collectives("native")
    return {"early": early, "in_flight": in_flight, "logged": logged, "outer": outer,
            "outer_args": [rec.issues[i] for i in outer], "inner": inner,
            "complete": rec.complete, "waits": rec.waits, "errors": errors}


@pytest.mark.timeout(200)
def test_handles_and_nested_trace():
    n = 3
    for rank, r in enumerate(run_world(n, _handles_and_trace, timeout_s=150)):
        assert r["early"], "an async hand op must complete when its ring is done, not at wait"
        assert r["in_flight"] == [n - 1 + 3.0, n - 1 + 2.0, n - 1 + 1.0]
        assert r["logged"] == [("all_reduce", 40)]            # inner steps stay out of the OpLog
        assert len(r["outer"]) == 1 and r["outer_args"][0]["impl"] == "hand"
        op_id = r["outer"][0]
        inner = r["inner"].values()
        assert len(inner) == 4 * (n - 1)                      # (RS + AG) x (N-1) steps x send/recv
        assert all(e["parent"] == op_id for e in inner)
        assert all(comm.HAND_TAG_BASE <= e["tag"] < comm.HAND_TAG_BASE + comm.HAND_TAG_SPAN
                   for e in inner)
        assert {e["phase"] for e in inner} == {"reduce_scatter", "all_gather"}
        assert {e["peer"] for e in inner if e["op"] == "send"} == {(rank + 1) % n}
        assert {e["peer"] for e in inner if e["op"] == "recv"} == {(rank - 1) % n}
        assert set(r["complete"]) == set(r["inner"]) | {op_id}
        assert r["complete"][op_id] >= max(r["complete"][i] for i in r["inner"])
        assert [w[0] for w in r["waits"]] == [op_id]          # the rank blocked on the outer op only
        assert len(r["errors"]) == 4, r["errors"]
        assert "group size 3" in r["errors"][0] and "not in group" in r["errors"][2]


def test_set_collectives_rejects_unknown_mode():
    with pytest.raises(ValueError, match="pick native or hand"):
        comm.set_collectives("nccl")


def test_the_package_registers_every_hand_collective():
    for op in HAND_OPS:
        assert getattr(comm.collectives, op).__module__ == "kernels.comm.collectives"
    comm.set_collectives("hand")            # refused if any hand op were missing
    comm.set_collectives("native")
    with pytest.raises(ValueError, match="the hand ops are"):
        register_hand_collectives({"gather": lambda *a: None})


# ---------------------------------------------------------------- whole plans

@pytest.mark.timeout(300)
def test_check_dp2_zero2_hand():
    check_plan("--dp", 2, "--zero", 2, "--collectives", "hand")


@pytest.mark.timeout(300)
def test_check_ep2_hand():
    check_plan("--dp", 2, "--experts", 4, "--ep", 2, "--collectives", "hand")
