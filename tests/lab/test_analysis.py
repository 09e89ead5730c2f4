"""The overlap analysis on synthetic traces with hand-computed answers (times in us, results ms)."""
import json
import math

import pytest

from partui.analysis import TraceError, hta_overlap, load, overlap, oversubscription_note, step_times
from partui.analysis.figures.cpu import core_sharing_line
from partui.bench.analysis import bench_analysis, describe


def X(rank, name, cat, ts, dur, tid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": rank, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def comm(rank, op, ts, dur, group="dp", lane=2, nbytes=8):
    return X(rank, op, "comm", ts, dur, tid=lane, op=op, group=group, bytes=nbytes, peer=None)


def write(tmp_path, events, name="t.json", **meta):
    names = [{"ph": "M", "name": "thread_name", "pid": r, "tid": t, "args": {"name": n}}
             for r in {e["pid"] for e in events} for t, n in ((1, "compute"), (2, "comm"),
                                                                (3, "comm 2"))]
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": names + events,
                                "metadata": {"format": "partui-trace/1", **meta}}))
    return str(path)


def two_ranks():
    return [
        X(0, "step", "step", 0, 100, step=0),
        X(0, "F", "F", 10, 30, step=0, mb=0),
        X(0, "layer 0", "F", 15, 10, step=0, mb=0, layer=0),  # nested inside F: counted once
        X(0, "B", "B", 50, 30, step=0, mb=0),
        comm(0, "all_reduce", 30, 30),                     # [30, 60]
        comm(0, "all_gather", 35, 10, lane=3),             # [35, 45], in flight beside it
        X(0, "wait all_reduce", "wait", 40, 5, op="all_reduce"),  # waits are not compute
        X(1, "step", "step", 0, 100, step=0),
        X(1, "F", "F", 0, 50, step=0, mb=0),               # rank 1: no comm at all
    ]


def test_per_rank_partial_overlap_nested_spans_and_empty_comm(tmp_path):
    df = load(write(tmp_path, two_ranks()))
    r = overlap(df, "rank").set_index("rank")
    # rank 0: compute [10,40]+[50,80] = 60, comm [30,60] = 30, both [30,40]+[50,60] = 20
    assert r.loc[0, "window_ms"] == pytest.approx(0.100)
    assert r.loc[0, "compute_ms"] == pytest.approx(0.060)
    assert r.loc[0, "comm_ms"] == pytest.approx(0.030)
    assert r.loc[0, "overlapped_ms"] == pytest.approx(0.020)
    assert r.loc[0, "exposed_comm_ms"] == pytest.approx(0.010)
    assert r.loc[0, "wait_ms"] == pytest.approx(0.005)
    assert r.loc[0, "idle_ms"] == pytest.approx(0.030)  # 100 - union [10, 80]
    assert r.loc[0, "overlap_pct"] == pytest.approx(200 / 3)
    assert r.loc[0, "bubble_pct"] == pytest.approx(40.0)
    assert r.loc[1, "comm_ms"] == 0 and r.loc[1, "exposed_comm_ms"] == 0
    assert math.isnan(r.loc[1, "overlap_pct"])
    assert r.loc[1, "idle_ms"] == pytest.approx(0.050) and r.loc[1, "bubble_pct"] == pytest.approx(50)


def test_per_step_windows_clip_an_op_that_crosses_steps(tmp_path):
    ev = [e for e in two_ranks() if e["pid"] == 0 and e["cat"] != "step"]
    ev += [X(0, "step", "step", 0, 50, step=0), X(0, "step", "step", 50, 50, step=1)]
    r = overlap(load(write(tmp_path, ev)), "step").set_index("step")
    # step 0 [0,50]: compute [10,40], comm [30,50] -> overlap [30,40]; idle 50 - [10,50]
    assert r.loc[0, ["compute_ms", "comm_ms", "overlapped_ms", "exposed_comm_ms", "idle_ms"]
                 ].tolist() == pytest.approx([0.030, 0.020, 0.010, 0.010, 0.010])
    # step 1 [50,100]: compute [50,80], comm [50,60] fully overlapped; idle 20
    assert r.loc[1, ["compute_ms", "comm_ms", "overlapped_ms", "exposed_comm_ms", "idle_ms"]
                 ].tolist() == pytest.approx([0.030, 0.010, 0.010, 0.0, 0.020])


def test_without_step_spans_the_window_is_each_ranks_extent(tmp_path):
    ev = [e for e in two_ranks() if e["cat"] != "step"]
    r = overlap(load(write(tmp_path, ev)), "rank").set_index("rank")
    assert r.loc[0, "window_ms"] == pytest.approx(0.070)  # [10, 80]
    assert r.loc[0, "idle_ms"] == pytest.approx(0.0)
    with pytest.raises(TraceError, match="no step spans"):
        overlap(load(write(tmp_path, ev)), "step")


def test_exposed_comm_by_op_and_group(tmp_path):
    r = overlap(load(write(tmp_path, two_ranks())), "op").set_index("op")
    assert r.loc["all_reduce", ["comm_ms", "overlapped_ms", "exposed_comm_ms"]].tolist() == \
        pytest.approx([0.030, 0.020, 0.010])
    assert r.loc["all_gather", ["comm_ms", "overlapped_ms", "exposed_comm_ms"]].tolist() == \
        pytest.approx([0.010, 0.005, 0.005])
    assert r.loc["all_reduce", "group"] == "dp" and r.loc["all_reduce", "ops"] == 1


def test_step_times_span_all_ranks(tmp_path):
    ev = two_ranks() + [X(1, "step", "step", 120, 30, step=1), X(0, "step", "step", 110, 50, step=1)]
    st = step_times(load(write(tmp_path, ev)))
    assert st["world_step_ms"].tolist() == pytest.approx([0.100, 0.050])


def pp2_report(tmp_path, schedule: str, spans: dict, name: str = "pp.json"):
    """overlap() per rank of a 2-rank pipeline trace: 4 microbatches, each {cat: (start offset, dur)}."""
    pytest.importorskip("planning.pipeline.simulate")
    ev = []
    for r in range(2):
        ev.append(X(r, "step", "step", 0, 2000, step=0))
        ev += [X(r, f"{cat}{m}", cat, 100 * m + t0, dur, mb=m, chunk=0)
               for m in range(4) for cat, (t0, dur) in spans.items()]
    path = write(tmp_path, ev, name, plan={"pp": 2, "schedule": schedule, "microbatches": 4},
                 coords={"0": "pp0", "1": "pp1"})
    return overlap(load(path), "rank")


def test_pipeline_trace_gets_the_schedules_theoretical_bubble(tmp_path):
    r = pp2_report(tmp_path, "1f1b", {"F": (0, 10), "B": (50, 20)})
    # 1F1B, F=1, B=2 units: bubble (p-1)(F+B) = 3 of a makespan m(F+B) + 3 = 15 -> 20%.
    # In each rank's own window (first to last action, as measured): rank 0 runs F0 at 0 and
    # B3 ends at 15, busy 12 -> 20%; rank 1 runs F0 at 1 to B3 ending at 13, busy 12 -> 0%
    assert r["sim_ideal_bubble_pct"].tolist() == pytest.approx([20.0, 0.0])
    assert r["formula_bubble_pct"].tolist() == pytest.approx([20.0, 20.0])
    # measured: actions [0, 370] per rank, 4 x (10 + 20) computing -> 1 - 120 / 370
    assert r["pipe_ms"].tolist() == pytest.approx([0.370, 0.370])
    assert r["pipe_bubble_pct"].tolist() == pytest.approx([100 * (1 - 120 / 370)] * 2)
    assert r["rest_ms"].tolist() == pytest.approx([2.0 - 0.370] * 2)
    assert "sim_bubble_pct" not in overlap(load(write(tmp_path, two_ranks(), "b.json")), "rank")


def test_pipeline_report_sets_the_formula_beside_the_simulator(tmp_path):
    """ZB1P with split backward spans: the formula takes B as the full backward (input + weight)."""
    r = pp2_report(tmp_path, "zb1p", {"F": (0, 10), "B": (40, 20), "W": (70, 10)})
    # F=1, B(input)=2, W=1: formula (P-1)(F+B_full-2W) = 1 * (1 + 3 - 2) = 2 units of a 4 * 4 + 2 = 18 step
    assert r["formula_bubble_pct"].tolist() == pytest.approx([100 * 2 / 18] * 2)
    # rank 0's window is the whole 18-unit step, so it agrees with the formula; rank 1 idles only
    # before its first F and after its last W, outside its own window
    assert r["sim_ideal_bubble_pct"].tolist() == pytest.approx([100 * 2 / 18, 0.0])


def test_rank_figures_sum_the_steps_and_skip_the_time_between_them(tmp_path):
    # two steps [0, 100] and [1000, 1100] (the user took 900 us to press a key): each runs an F
    # action [10, 90] (a layer nested in it) and then a loss all-reduce [90, 100]
    ev = []
    for k, t in enumerate((0, 1000)):
        ev += [X(0, "step", "step", t, 100, step=k), X(0, "F", "F", t + 10, 80, chunk=0),
               X(0, "W", "W", t + 40, 0, chunk=0), comm(0, "all_reduce", t + 90, 10),
               X(0, "F block 0", "layer", t + 20, 50)]
    df = load(write(tmp_path, ev, plan={"pp": 1}))
    r = overlap(df, "rank").iloc[0]
    assert r["window_ms"] == pytest.approx(0.200) and r["compute_ms"] == pytest.approx(0.160)
    assert r["idle_ms"] == pytest.approx(0.020)   # [0, 10] of each step; nothing from the gap
    assert r["pipe_ms"] == pytest.approx(0.160) and r["rest_ms"] == pytest.approx(0.040)
    assert r["pipe_bubble_pct"] == pytest.approx(0.0)   # F itself computes all of [10, 90]
    s = overlap(df, "step")
    assert s["pipe_ms"].tolist() == pytest.approx([0.080, 0.080])
    assert overlap(df, "op").iloc[0]["comm_ms"] == pytest.approx(0.020)


def kineto(tmp_path, events, name, rank=0):
    path = tmp_path / name
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": rank},
                                "traceEvents": events}))
    return str(path)


def test_kineto_gpu_trace_nccl_against_kernels_and_hta_overlap(tmp_path):
    ev = [{"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 0, "tid": 7, "ts": 0, "dur": 10},
          {"ph": "X", "cat": "kernel", "name": "elementwise", "pid": 0, "tid": 7, "ts": 20, "dur": 10},
          {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0,
           "tid": 9, "ts": 5, "dur": 20},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 40}]
    df = load(kineto(tmp_path, ev, "gpu.json", rank=3))
    assert set(df["rank"]) == {3}
    assert df.loc[df["kind"] == "comm", "op"].tolist() == ["all_reduce"]
    h = hta_overlap(df)
    assert h["comm_comp_overlap_pct"].tolist() == pytest.approx([50.0])  # [5,10] + [20,25] of 20
    r = overlap(df, "rank").iloc[0]
    assert (r["compute_ms"], r["comm_ms"]) == pytest.approx((0.020, 0.020))  # CPU ops not counted


def test_kineto_cpu_gloo_trace_and_hta_gives_nothing(tmp_path):
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1,
           "ts": 0, "dur": 200},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
          {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 100,
           "dur": 5},
          {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 2,
           "ts": 50, "dur": 100}]
    df = load(kineto(tmp_path, ev, "cpu.json"))
    assert set(df.loc[df["kind"] == "comm", "op"]) == {"all_reduce"}
    s = overlap(df, "step").iloc[0]
    assert s["step"] == 4
    assert s[["compute_ms", "comm_ms", "overlapped_ms", "idle_ms"]].tolist() == pytest.approx(
        [0.100, 0.100, 0.050, 0.050])
    assert hta_overlap(df)["comm_comp_overlap_pct"].isna().all()


@pytest.mark.parametrize("content, problem", [
    ('{"traceEvents": [{"ph": "X"', "truncated"),
    ('[1, 2, 3]', "not a Chrome trace"),
    ('{"traceEvents": []}', "unknown trace format"),
])
def test_bad_input_names_file_and_problem(tmp_path, content, problem):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(TraceError, match=problem) as exc:
        load(str(p))
    assert str(p) in str(exc.value)
    with pytest.raises(TraceError, match="no such file"):
        load(str(tmp_path / "missing.json"))


def test_bench_analysis_reports_phases_and_memory():
    res = bench_analysis(20_000)
    assert 19_000 <= res["events"] <= 23_000 and res["rows"][0] == 8 and res["rows"][1] == 80
    assert res["load_and_analyse_s"] > 0 and res["peak_rss_mb"] > 0 and res["load_and_analyse_cpu_s"] > 0
    text = describe(res)
    assert "s CPU" in text and "load and analyse" in text and f"{res['events']:,} events" in text


def test_a_wait_inside_a_compute_span_is_exposed_not_overlapped(tmp_path):
    # a leaf layer span [0, 100] wraps a blocking all-to-all [20, 60] whose wait is [20, 60]
    ev = [X(0, "step", "step", 0, 100, step=0), X(0, "F block 0", "layer", 0, 100, step=0, mb=0),
          comm(0, "all_to_all", 20, 40, group="ep"),
          X(0, "wait all_to_all", "wait", 20, 40, op="all_to_all")]
    df = load(write(tmp_path, ev))
    r = overlap(df, "rank").iloc[0]
    assert r["compute_ms"] == pytest.approx(0.060)  # 100 minus the 40 spent blocked
    assert r["overlapped_ms"] == pytest.approx(0.0)
    assert r["exposed_comm_ms"] == pytest.approx(0.040)
    by_op = overlap(df, "op").iloc[0]
    assert by_op["op"] == "all_to_all" and by_op["overlap_pct"] == pytest.approx(0.0)


def test_containers_never_count_and_posting_an_op_is_not_compute(tmp_path):
    # an F+B microbatch [0, 100] and an F&B pair [100, 200] hold leaves [10, 30], [50, 90] and
    # [120, 180]; an all-to-all is in flight [25, 70]: posted [25, 35] inside the first leaf
    # (the rank busy posting, not computing), waited [60, 70] outside any leaf
    ev = [X(0, "step", "step", 0, 200, step=0),
          X(0, "F+B", "microbatch", 0, 100, mb=0), X(0, "FB mb1 / mb0", "FB", 100, 100, mb=1),
          X(0, "F block 0", "layer", 10, 20), X(0, "experts", "expert", 50, 40),
          X(0, "B block 0", "layer", 120, 60),
          comm(0, "all_to_all", 25, 45, group="ep"),
          X(0, "post all_to_all", "post", 25, 10, op="all_to_all"),
          X(0, "wait all_to_all", "wait", 60, 10, op="all_to_all")]
    df = load(write(tmp_path, ev))
    assert set(df["kind"]) == {"step", "container", "compute", "comm", "wait"}
    r = overlap(df, "rank").iloc[0]
    # compute: leaves less posting and waiting: [10, 25] + [50, 60] + [70, 90] + [120, 180]
    assert r["compute_ms"] == pytest.approx(0.105)
    # in flight [25, 70] meets compute on [50, 60] only: posting and waiting are exposed
    assert r["comm_ms"] == pytest.approx(0.045) and r["overlapped_ms"] == pytest.approx(0.010)
    assert r["wait_ms"] == pytest.approx(0.020)
    by_op = overlap(df, "op").iloc[0]
    assert by_op["overlap_pct"] == pytest.approx(100 * 10 / 45)


def test_no_core_time_is_outer_compute_outside_waits_less_its_cpu_time(tmp_path):
    # F [0, 60] got 30 us of CPU and slept in a wait [20, 30]: runnable without a core for
    # 60 - 10 - 30 = 20; its nested layer is not counted again; the optimizer [70, 90] ran all along
    ev = [X(0, "step", "step", 0, 100, step=0), X(0, "F", "F", 0, 60, chunk=0, cpu_us=30.0),
          X(0, "F block 0", "layer", 10, 40, cpu_us=20.0),
          X(0, "wait recv", "wait", 20, 10, op="recv"),
          X(0, "adamw", "optimizer", 70, 20, cpu_us=20.0)]
    r = overlap(load(write(tmp_path, ev)), "rank").iloc[0]
    assert r["cpu_ms"] == pytest.approx(0.050) and r["no_core_ms"] == pytest.approx(0.020)
    line = core_sharing_line(overlap(load(write(tmp_path, ev)), "rank"))
    assert line.startswith("core sharing: rank 0 was runnable but not running for 0.0 ms")


def test_traces_without_cpu_times_have_no_core_columns(tmp_path):
    assert "no_core_ms" not in overlap(load(write(tmp_path, two_ranks())), "rank")


def test_an_older_traces_comm_span_on_the_compute_track_is_a_wait_not_an_op(tmp_path):
    # ZeRO-3's "param all-gather wait" was recorded with category comm on the compute track
    ev = [X(0, "step", "step", 0, 100, step=0), X(0, "F block 0", "layer", 0, 100),
          X(0, "param all-gather wait", "comm", 40, 20)]
    df = load(write(tmp_path, ev))
    assert df.loc[df["name"] == "param all-gather wait", "kind"].tolist() == ["wait"]
    assert len(overlap(df, "op")) == 0 and overlap(df, "rank").iloc[0]["compute_ms"] == \
        pytest.approx(0.080)


def test_viztracer_calls_on_the_compute_track_change_no_figure(tmp_path):
    # partui.recording.trace puts viztracer's calls (cat FEE) on the compute track where they nest: one around
    # the whole step, one in rank 0's gap [40, 50] between F and B, one inside its wait [40, 45]
    calls = [X(0, "do (executor.py:162)", "FEE", 0, 100), X(0, "glue (x.py:1)", "FEE", 41, 8),
             X(0, "Handle.wait (handles.py:87)", "FEE", 40, 5), X(1, "forward (m.py:3)", "FEE", 60, 30)]
    plain = load(write(tmp_path, two_ranks(), "plain.json"))
    traced = load(write(tmp_path, two_ranks() + calls, "traced.json"))
    assert set(traced.loc[traced["cat"] == "FEE", "kind"]) == {"other"}
    for by in ("rank", "step", "op"):
        assert overlap(traced, by).equals(overlap(plain, by)), by
    r = overlap(traced, "rank").set_index("rank")       # the hand-computed figures still hold
    assert r.loc[0, "compute_ms"] == pytest.approx(0.060) and r.loc[0, "bubble_pct"] == pytest.approx(40.0)
    assert r.loc[1, "compute_ms"] == pytest.approx(0.050)
