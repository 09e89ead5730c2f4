"""`partui blame` on a hand-built partui pipeline trace, pp 2 x dp 2, 1F1B over 2 microbatches,
every send waited at the step's end (as partui's pipeline does), rank 1 (dp 1, stage 0) with its
compute `k` times as long. The timeline is written out by hand below; with no launch gaps the
replayed step is the recorded one, and the ideal step is the unslowed world's, so the slowdown
is the step-time ratio, worked by hand: (k = 1.5) 12.25 ms / 10.5 ms; (k = 1) exactly 1.

Before the fix a send's transfer was its wait's end (the step's end) less its issue: most of the
step; its typical, replayed on every send, made the ideal step longer than the recorded one."""
import pytest

from planning.mesh import Plan
from partui.analysis.replay.blame import analyse, as_recorded, typical_durations
from partui.analysis.replay.opgraph import Node, StepGraph, step_time
from partui.analysis.replay.partui_graph import partui_graphs

F, B, OPT, AR = 1.0, 2.0, 0.5, 1.0          # ms: a forward, a backward, the optimizer, all-reduce


def X(pid, name, cat, ts_ms, dur_ms, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": 1, "ts": ts_ms * 1e3,
            "dur": dur_ms * 1e3, "args": args}


class Rank:
    """One rank's events, written in program order."""

    def __init__(self, rank):
        self.rank, self.ev, self.op_id = rank, [], 100 * rank

    def compute(self, name, t0, t1):
        self.ev.append(X(self.rank, name, "F" if name[0] == "F" else "B", t0, t1 - t0))

    def issue(self, op, t, peer=None, group="pp"):
        self.op_id += 1
        self.ev.append(X(self.rank, op, "comm", t, 0.01, op_id=self.op_id, op=op, group=group,
                         peer=peer, bytes=1000))
        return self.op_id

    def wait(self, op_id, t0, t1):
        self.ev.append(X(self.rank, "wait", "wait", t0, t1 - t0, op_id=op_id))


def pipeline_doc(k: float) -> dict:
    """Ranks: dp d, stage s is rank d + 2 s. Stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1; a
    p2p transfer takes no time, a dp all-reduce AR ms from its last member's issue."""
    ranks = {r: Rank(r) for r in range(4)}
    ar_issue, ends = {}, {}
    for d in (0, 1):
        f0, b0 = F * (k if d == 1 else 1), B * (k if d == 1 else 1)   # stage 0's compute
        s0, s1 = ranks[d], ranks[d + 2]
        a0 = s1.issue("recv", 0, peer=d)                  # stage 1 posts its first recv at once
        s0.compute("F0", 0, f0)
        sa0 = s0.issue("send", f0, peer=d + 2)
        s1.wait(a0, 0, f0)                                # blocked until stage 0's first send
        s0.compute("F1", f0, 2 * f0)
        sa1 = s0.issue("send", 2 * f0, peer=d + 2)
        g0 = s0.issue("recv", 2 * f0, peer=d + 2)
        s1.compute("F0", f0, f0 + F)
        s1.compute("B0", f0 + F, f0 + F + B)
        sg0 = s1.issue("send", f0 + F + B, peer=d)
        s0.wait(g0, 2 * f0, f0 + F + B)                   # stage 0 waits for the first gradient
        a1 = s1.issue("recv", f0 + F + B, peer=d)         # activation 1 came at 2 f0: no wait
        s1.wait(a1, f0 + F + B, f0 + F + B)
        s1.compute("F1", f0 + F + B, f0 + 2 * F + B)
        s1.compute("B1", f0 + 2 * F + B, f0 + 2 * F + 2 * B)
        sent_g1 = f0 + 2 * F + 2 * B
        sg1 = s1.issue("send", sent_g1, peer=d)
        s0.compute("B0", f0 + F + B, f0 + F + B + b0)
        g1 = s0.issue("recv", f0 + F + B + b0, peer=d + 2)
        got_g1 = max(f0 + F + B + b0, sent_g1)
        s0.wait(g1, f0 + F + B + b0, got_g1)
        s0.compute("B1", got_g1, got_g1 + b0)
        ar_issue[d], ar_issue[d + 2] = got_g1 + b0, sent_g1
        ends[d] = [sa0, sa1]
        ends[d + 2] = [sg0, sg1]
    for r, rk in ranks.items():
        mates = (0, 1) if r < 2 else (2, 3)              # the dp group of r's stage
        done = max(ar_issue[m] for m in mates) + AR
        ar = rk.issue("all_reduce", ar_issue[r], group="dp")
        rk.wait(ar, ar_issue[r], done)
        for sent in ends[r]:                              # the sends, waited at the step's end
            rk.wait(sent, done, done)
        opt = OPT * (k if r == 1 else 1)
        rk.compute("optimizer", done, done + opt)
        rk.ev.insert(0, X(r, "step", "step", 0, done + opt, step=0))
    return {"traceEvents": [e for rk in ranks.values() for e in rk.ev],
            "metadata": {"plan": Plan(world=4, dp=2, pp=2, schedule="1f1b",
                                      microbatches=2).to_dict()}}


def summary(k):
    g = partui_graphs(pipeline_doc(k))
    res = analyse(g)
    return g[0], dict(zip(res["summary"]["figure"], res["summary"]["value"])), res


@pytest.mark.parametrize("k, recorded_ms, ideal_ms", [
    # k = 1.5: rank 1's F 1.5, B 3: B1 ends at 10.5, its all-reduce at 11.5, its optimizer
    # (0.75) at 12.25. k = 1: stage 0 ends B1 at 9, + 1 + 0.5. Ideal: the k = 1 step.
    (1.5, 12.25, 10.5),
    (1.0, 10.5, 10.5),
])
def test_a_pipeline_with_one_slow_rank_reads_the_step_time_ratio(k, recorded_ms, ideal_ms):
    g, s, res = summary(k)
    assert g.recorded == pytest.approx(recorded_ms / 1e3)
    # no launch gaps: replaying as recorded gives the recorded step
    assert step_time(g.replay()) == pytest.approx(recorded_ms / 1e3)
    assert s["replayed_s"] == pytest.approx(recorded_ms / 1e3)
    assert s["ideal_s"] == pytest.approx(ideal_ms / 1e3)
    assert s["slowdown"] == pytest.approx(recorded_ms / ideal_ms)
    if k > 1:
        assert s["worst worker"] == 1 and s["top dp rank"] == 1 and s["top stage"] == 0
        by = dict(zip(res["by worker"]["rank"], res["by worker"]["slowdown"]))
        # rank 1 alone as recorded is the whole slowdown (stage 1 only waits on it)
        assert by == pytest.approx({1: 12.25 / 10.5, 0: 1.0, 2: 1.0, 3: 1.0})


def test_sends_waited_at_the_step_end_take_their_recvs_transfer():
    g, _s, _res = summary(1.5)
    sends = [n for n in g.nodes if n.kind == "send"]
    assert len(sends) == 8 and all(n.dur == 0.0 for n in sends)
    ar = sorted(n.dur for n in g.nodes if n.kind == "all_reduce")
    assert ar == pytest.approx([AR / 1e3] * 4)


def test_only_waits_begun_by_the_last_issue_measure_a_transfer():
    g, _s, _res = summary(1.5)
    recvs = {(n.rank, n.id[1][4]): n.measured for n in g.nodes if n.kind == "recv"}
    # every recv here is waited from its issue on, or posted after its send and waited at once:
    # each wait saw the whole transfer from the last issue
    assert recvs == {(r, n): True for r in range(4) for n in (0, 1)}
    # a recv posted at 0, its send issued at 1 ms, the recv waited at 3 ms after 2 ms of compute:
    # 3.01 - 1 ms only bounds its transfer (and its send, waited at 4 ms, takes the recv's)
    doc = {"traceEvents": [
        X(0, "step", "step", 0, 5, step=0), X(1, "step", "step", 0, 5, step=0),
        X(1, "recv", "comm", 0, 0.01, op_id=1, op="recv", group="pp", peer=0, bytes=8),
        X(0, "send", "comm", 1, 0.01, op_id=1, op="send", group="pp", peer=1, bytes=8),
        X(1, "wait", "wait", 3, 0.01, op_id=1), X(0, "wait", "wait", 4, 0.01, op_id=1)],
        "metadata": {}}
    p2p = {n.kind: (n.dur, n.measured) for n in partui_graphs(doc)[0].nodes if n.kind}
    assert p2p["recv"] == p2p["send"] == (pytest.approx(2.01e-3), False)


def test_a_bound_counts_as_recorded_only_up_to_its_types_typical():
    typ = {("comm", "recv", "pp"): 1e-3}
    bound = Node(("r",), (0, "main"), 3e-3, ("comm", "recv", "pp"), 0, 0, 0, measured=False)
    seen = Node(("s",), (0, "main"), 3e-3, ("comm", "recv", "pp"), 0, 0, 0)
    assert as_recorded(bound, typ) == 1e-3 and as_recorded(seen, typ) == 3e-3
    bound.dur = 0.5e-3
    assert as_recorded(bound, typ) == 0.5e-3


def test_typical_compute_is_the_fastest_ranks_own_not_a_least_per_place():
    """Rank 0's places last 1 and 3.5 s, rank 1's 2 and 2: rank 1 is the faster (4 s against 4.5);
    the least per place (1 and 2 s) would be a step no rank ran."""
    def step(s):
        return StepGraph(s, [Node(("b", r, k), (r, "main"), d, ("busy", 0, k), r, r, 0)
                             for r, ds in ((0, (1.0, 3.5)), (1, (2.0, 2.0)))
                             for k, d in enumerate(ds)], typical="fastest")
    typ = typical_durations([step(0), step(1)])
    assert typ == {("busy", 0, 0): 2.0, ("busy", 0, 1): 2.0}
