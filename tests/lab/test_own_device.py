"""One device per rank: whatif's replay with each rank's busy time cut to the CPU time it got
(partui.analysis.replay.whatif.on_own_cores), and the benches' own_device_ms / core_share_pct and their
sentence on who decided the step (partui.bench.own_device), on a hand-built trace worked by hand."""
import pytest

from partui.analysis.replay.whatif import on_own_cores, programs, simulate
from partui.bench.own_device import cores_verdict, own_device
from partui.world.plans import build_plan
from planning.link import build_link


def X(pid, name, cat, ts_ms, dur_ms, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": 1, "ts": ts_ms * 1e3,
            "dur": dur_ms * 1e3, "args": args}


AR = dict(op="all_reduce", group="dp", bytes=1_000_000, peer=None)


def rank_events(rank):
    """Rank 0 issues a 1 MB all-reduce at 2 ms, waits 5-5.1 ms, ends at 6 ms: busy 5.9 ms, of which
    it got 2.95 ms of CPU (a core half the time). Rank 1 issues at 4 ms and waits 4-5.1 ms: busy
    4.9 ms, all of it on a core."""
    if rank == 0:
        return [X(0, "step", "step", 0, 6, step=0, cpu_us=2950.0),
                X(0, "all_reduce", "comm", 2, 3.1, op_id=1, **AR), X(0, "wait", "wait", 5, 0.1, op_id=1)]
    return [X(1, "step", "step", 0, 6, step=0, cpu_us=4900.0),
            X(1, "all_reduce", "comm", 4, 1.1, op_id=7, **AR), X(1, "wait", "wait", 4, 1.1, op_id=7)]


def test_each_rank_busy_time_is_cut_to_its_cpu_time():
    doc = {"traceEvents": rank_events(0) + rank_events(1), "metadata": {}}
    progs = on_own_cores(doc, programs(doc))
    assert progs[0]["core_share"] == pytest.approx(0.5) and progs[1]["core_share"] == pytest.approx(1.0)
    assert [it[1] for it in progs[0]["items"] if it[0] == "busy"] == pytest.approx([1e6, 1.5e6, 0.45e6])
    # 1 GB/s, no latency: the all-reduce moves 2 * (1/2) * 1 MB = 1 ms after the last issue (rank 1,
    # 4 ms): rank 0 issues at 1 ms, waits from 2.5 to 5 ms, then 0.45 ms; rank 1 ends at 5.9 ms
    t = simulate(progs, build_link("alpha_us=0,gbps=1"))[0].set_index("rank")
    assert t.loc[0, "predicted_step_ms"] == pytest.approx(5.45)
    assert t.loc[1, "predicted_step_ms"] == pytest.approx(5.9)


def test_a_step_without_cpu_time_keeps_its_busy_time():
    evs = [dict(e, args={k: v for k, v in e["args"].items() if k != "cpu_us"})
           for e in rank_events(0) + rank_events(1)]
    doc = {"traceEvents": evs, "metadata": {}}
    assert all(p["core_share"] == 1.0 for p in on_own_cores(doc, programs(doc)).values())


def test_bench_own_device_and_core_share():
    recorded = [{"rank": r, "coords": f"dp{r}", "events": rank_events(r), "t0_us": 0.0, "t1_us": 6000.0}
                for r in (0, 1)]
    plan, _cfg = build_plan("custom", "tiny", {}, dp=2)
    own_ms, share = own_device(recorded, plan, build_link("alpha_us=0,gbps=1"))
    assert own_ms == pytest.approx(5.9)
    assert share == pytest.approx(100 * (2.95 + 4.9) / (5.9 + 4.9))   # CPU over busy, all ranks
    assert own_device(recorded, plan, None) == (None, pytest.approx(share))


def test_the_verdict_names_the_cores_below_80_percent():
    assert "the shared cores, not the schedule, decide" in cores_verdict(72.7, 2)
    assert "had a core for 73% of their busy time" in cores_verdict(72.7, 2)
    assert "the schedule, not core sharing, decides" in cores_verdict(95.0, 2)
