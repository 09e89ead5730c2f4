"""The emulated interconnect: the alpha-beta costs against the formulas worked by hand, specs and
presets, and on a real 2-rank gloo world: ops held to their modelled end with exact results, the
last member's issue starting a collective, a recv ending with its send, ops sharing a port, and a
held op waited on without burning CPU."""
import ctypes
import sys
import threading
import time

import pytest
import torch

from kernels import comm
from kernels.comm import emulate, events
from planning.link import (LinkModel, LinkSpec, build_link, check_link, op_cost, parse_link)
from worlds import run_world

# a = 10 us, B = 2 GB/s; b = 1 MB
SPEC = LinkSpec(alpha_us=10.0, gbps=2.0)
MB = 1_000_000


@pytest.mark.parametrize("op,n,nbytes,alpha_s,beta_s", [
    # ring all-reduce, 4 ranks: 2*3 alphas; 2*(3/4)*1e6 B / 2e9 B/s = 0.75 ms
    ("all_reduce", 4, MB, 60e-6, 0.75e-3),
    ("reduce_scatter", 4, MB, 30e-6, 0.375e-3),     # 3 alphas; (3/4) * 1 MB / 2 GB/s
    ("all_gather", 2, MB, 10e-6, 0.25e-3),          # 1 alpha; (1/2) * 1 MB / 2 GB/s
    # all-to-all is recorded as send + receive buffers (2 MB): (1/2) * 1 MB / 2 GB/s
    ("all_to_all", 2, 2 * MB, 10e-6, 0.25e-3),
    ("all_to_all", 4, 2 * MB, 30e-6, 0.375e-3),
    ("broadcast", 4, MB, 30e-6, 0.5e-3),
    ("send", 2, MB, 10e-6, 0.5e-3),
    ("recv", 2, MB, 10e-6, 0.5e-3),
    ("barrier", 4, 0, 30e-6, 0.0),
    ("all_reduce", 1, MB, 0.0, 0.0),                # a group of one moves nothing
])
def test_op_cost_matches_the_alpha_beta_formulas(op, n, nbytes, alpha_s, beta_s):
    a, b = op_cost(op, n, nbytes, SPEC)
    assert a == pytest.approx(alpha_s) and b == pytest.approx(beta_s)


def test_groups_across_nodes_take_the_inter_node_link():
    m = LinkModel(LinkSpec(1, 100), LinkSpec(5, 10), ranks_per_node=2)
    assert m.spec_for([0, 1]) == m.intra and m.spec_for([2, 3]) == m.intra
    assert m.spec_for([1, 2]) == m.inter and m.spec_for([0, 1, 2, 3]) == m.inter
    assert LinkModel(SPEC, LinkSpec(1, 1)).spec_for([0, 7]) == SPEC   # one node by default


def test_presets_are_scaled_by_the_calibration():
    # H800: 989 TFLOP/s; a CPU rank at 9.89 GFLOP/s is 1e5 times slower, so links slow 1e5 times
    m = build_link("h800", ranks_per_node=2, cpu_flops=9.89e9)
    assert m.factor == pytest.approx(1e5)
    assert m.intra.gbps == pytest.approx(160 / 1e5) and m.inter.gbps == pytest.approx(50 / 1e5)
    assert m.intra.alpha_us == pytest.approx(3 * 1e5)
    assert "h800" in m.describe() and "x1e+05" in m.describe()
    custom = build_link("alpha_us=5,gbps=0.5")
    assert custom.factor == 1 and custom.intra == custom.inter == LinkSpec(5, 0.5)
    assert LinkModel.from_dict(m.to_dict()) == m


@pytest.mark.parametrize("text,words", [
    ("h900", "not a preset"), ("alpha_us=5", "needs both"), ("alpha_us=x,gbps=1", "not a number"),
    ("alpha_us=1,gbps=0", "gbps a finite number > 0"), ("alpha=1,gbps=1", "unknown key"),
])
def test_bad_link_specs_say_what_and_how(text, words):
    with pytest.raises(ValueError, match=words) as e:
        parse_link(text)
    assert "link=" in str(e.value)
    assert parse_link("H800") == ("h800", None)


def test_ranks_per_node_needs_a_link_and_must_divide_the_world():
    with pytest.raises(ValueError, match="add link=h800"):
        check_link(None, 2, 4)
    with pytest.raises(ValueError, match="divide world 4"):
        check_link("h800", 3, 4)
    check_link("h800", 2, 4)


def test_a_preset_needs_a_calibration():
    with pytest.raises(ValueError, match="calibration"):
        build_link("h800")


# ---------------------------------------------------------------- held ops on a real world

def _held_all_reduce(rank, size, link):
    """A 4 MB all-reduce on a 0.01 GB/s link: 2 * (1/2) * 4e6 / 1e7 = 0.4 s; plus 1 ms latency."""
    torch.set_num_threads(1)
    emulate.set_link(link)
    t = torch.full((1_000_000,), float(rank + 1))
    cpu0, t0 = time.process_time(), events.now_ns()
    h = comm.all_reduce(t, comm.world_group(), async_op=True)
    h.wait()
    elapsed, cpu = (events.now_ns() - t0) / 1e9, time.process_time() - cpu0
    rec = h.rec
    emulate.set_link(None)
    return {"elapsed": elapsed, "cpu": cpu, "exact": bool((t == 3.0).all()),
            "modelled": (rec.t_complete - rec.t_issue) / 1e9}


def test_a_held_collective_ends_at_its_modelled_time_and_never_burns_cpu():
    link = build_link("alpha_us=1000,gbps=0.01")
    out = run_world(2, _held_all_reduce, link, timeout_s=120)
    for r in out:
        assert r["exact"]                                   # gloo moved the bytes
        assert r["modelled"] >= 0.401 - 1e-3               # 0.4 s transfer + 1 ms latency
        assert r["elapsed"] >= 0.4
        # waiting sleeps: a spinning wait burns about the whole wait in CPU time; the real transfer
        # (gloo's threads move 4 MB, ~0.04 s here and more on a loaded machine) must stay well under half
        assert r["cpu"] < 0.5 * r["elapsed"], r


def _late_member(rank, size, link):
    """Rank 1 issues 0.3 s after rank 0: the op starts at the last member's issue."""
    emulate.set_link(link)
    comm.barrier(comm.world_group())
    if rank == 1:
        time.sleep(0.3)
    t = torch.ones(250_000)                           # 1 MB: 2 * (1/2) * 1e6 / 1e8 = 10 ms
    h = comm.all_reduce(t, comm.world_group(), async_op=True)
    h.wait()
    emulate.set_link(None)
    return h.rec.t_issue, h.rec.t_complete


def test_a_collective_starts_when_its_last_member_issues_it():
    out = run_world(2, _late_member, build_link("alpha_us=0,gbps=0.1"), timeout_s=120)
    last_issue = max(i for i, _ in out)
    for _issue, done in out:
        assert done >= last_issue + 10e6 - 1e5           # 10 ms after the late issue (ns)


def _p2p_and_shared_port(rank, size, link):
    t = torch.arange(250_000, dtype=torch.float32)    # 1 MB: 1e6 / 1e8 = 10 ms a message
    t2, warm = t * 2, torch.zeros(1)
    (comm.isend if rank == 0 else comm.irecv)(warm, 1 - rank, tag=3).wait()  # pair connected
    emulate.set_link(link)
    comm.barrier(comm.world_group())
    out = {}
    if rank == 0:
        h1, h2 = comm.isend(t, 1, tag=1), comm.isend(t2, 1, tag=2)   # one port: shared
        h1.wait(), h2.wait()
        out = {"ends": [(h.rec.t_complete - h1.rec.t_issue) / 1e6 for h in (h1, h2)],
               "send_done": [h1.rec.t_complete, h2.rec.t_complete],
               "second_issued": (h2.rec.t_issue - h1.rec.t_issue) / 1e6}
    else:
        a, b = torch.empty_like(t), torch.empty_like(t)
        r1, r2 = comm.irecv(a, 0, tag=1), comm.irecv(b, 0, tag=2)
        r1.wait(), r2.wait()
        out = {"exact": bool((a == t).all() and (b == 2 * t).all()),
               "recv_done": [r1.rec.t_complete, r2.rec.t_complete],
               "recv_issued": [r1.rec.t_issue, r2.rec.t_issue]}
    emulate.set_link(None)
    return out


def test_sends_share_their_port_and_a_recv_ends_with_its_send():
    out = run_world(2, _p2p_and_shared_port, build_link("alpha_us=0,gbps=0.1"), timeout_s=120)
    first, second = out[0]["ends"]
    assert first == pytest.approx(10, abs=1.5)           # ms after the first issue
    # the second starts while the first still moves: half the bandwidth, 20 ms from its issue
    # (10 ms if the machine was so busy that it issued after the first had finished)
    issued = out[0]["second_issued"]
    assert second == pytest.approx(issued + (20 if issued < first else 10), abs=0.01)
    assert out[1]["exact"]
    # the send's published end, to the ns (or the recv's own issue, if it was posted later)
    assert out[1]["recv_done"] == [max(s, r) for s, r in zip(out[0]["send_done"],
                                                          out[1]["recv_issued"])]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timer slack is Linux's")
def test_a_held_wait_sleeps_with_a_1_ns_timer_slack():
    """The default 50 us slack lets Linux wake each held wait that late; a sleep_until sets its
    own thread's to 1 ns (read with prctl PR_GET_TIMERSLACK in a fresh thread, after the sleep)."""
    seen = []

    def probe():
        get = lambda: ctypes.CDLL(None).prctl(30, 0, 0, 0, 0)  # noqa: E731  PR_GET_TIMERSLACK
        before = get()
        emulate.sleep_until(events.now_ns() + 1_000_000)
        seen.extend([before, get()])
    t = threading.Thread(target=probe)
    t.start()
    t.join(10)
    assert seen[1] == 1, f"timer slack {seen[1]} ns after a held wait (was {seen[0]} before)"
