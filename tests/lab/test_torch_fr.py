"""torch's flight recorder dumps under gloo, hand-built as torch 2.13 writes them (no completion, no
p2p, no group members): the world's size, the missing rank, each rank's inferred wait, and partui's
dump of the same run filling each gap with its source named. The torchrun watcher's stop rule."""
import pickle

import pytest

from partui.diagnosis import doctor, torch_fr
from partui.commands.doctor import load
from partui.diagnosis.fr_merge import merge
from partui.diagnosis.torchrun_watch import stopped


def entry(pg, desc, seq, op, ins, outs=None, dtype="Float", t=0):
    return {"process_group": (pg, desc), "collective_seq_id": seq, "p2p_seq_id": 0,
            "profiling_name": f"gloo:{op}", "input_sizes": ins, "output_sizes": outs or ins,
            "input_dtypes": [dtype] * len(ins), "state": "scheduled", "is_p2p": False,
            "time_created_ns": t, "time_discovered_completed_ns": None,
            "time_discovered_started_ns": None}


def write(prefix, rank, entries):
    with open(f"{prefix}{rank}", "wb") as f:
        pickle.dump({"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
                     "pg_status": {}, "entries": entries}, f)


GATHER = entry("0", "default_pg", 1, "all_gather", [[1]], [[2, 1]], "Long", t=100)


def test_a_rank_that_left_no_dump_is_counted_and_what_is_missing_said(tmp_path):
    prefix = str(tmp_path / "rank_")
    write(prefix, 0, [GATHER, entry("1", "dp", 1, "all_reduce", [[8]], t=200),
                      entry("1", "dp", 2, "all_reduce", [[4]], t=300)])
    d = torch_fr.to_dump(prefix)
    assert d["world"] == 2 and d["absent"] == [1]        # the size from the gather's output
    v = doctor.verdict(d)
    h = v["headline"]
    assert (h["kind"], h["group"], h["seq"], h["culprits"]) == ("hang", "dp", 2, [1]), h
    text = "\n".join(doctor.render(v))
    assert "missing: rank(s) [1] left no torch dump" in text
    assert "torch records no p2p op (send / recv) under gloo" in text
    assert "group(s) ['dp', 'world']" in text            # one rank's entries only: a guess, said


def test_gloo_wait_is_the_oldest_op_a_member_never_entered_so_opposite_orders_deadlock(tmp_path):
    prefix = str(tmp_path / "rank_")
    # rank 0: dp seq 1 (both), dp seq 2, dp seq 3 (async); rank 1: dp seq 1, then a barrier in
    # ep_dp that rank 0 never enters: the same as partui's own world says (tests/lab/test_faults)
    write(prefix, 0, [GATHER, entry("1", "dp", 1, "all_reduce", [[8]], t=200),
                      entry("1", "dp", 2, "all_reduce", [[8]], t=300),
                      entry("1", "dp", 3, "all_reduce", [[4]], t=310)])
    write(prefix, 1, [GATHER, entry("1", "dp", 1, "all_reduce", [[8]], t=205),
                      entry("2", "ep_dp", 1, "barrier", [], t=290)])
    d = torch_fr.to_dump(prefix)
    waits = {rk["rank"]: (rk["waiting"]["group"], rk["waiting"]["seq"]) for rk in d["ranks"]}
    assert waits == {0: ("dp", 2), 1: ("ep_dp", 1)}      # not rank 0's newest (dp 3)
    h = doctor.verdict(d)["headline"]
    assert h["kind"] == "deadlock" and h["culprits"] == [0, 1], h
    assert h["cycle"][0].startswith("dp all_reduce seq 2") or h["cycle"][1].startswith(
        "dp all_reduce seq 2"), h


def partui_part(rank, records, waiting=None, t_dump=1_000, wall=1_000_000):
    return {"rank": rank, "step": 1, "span": "step", "t_dump": t_dump, "t_dump_wall": wall,
            "waiting": waiting, "groups": {"pp": [0, 1], "world": [0, 1]}, "records": records}


def prec(op, group, seq, peer=None, t=0, shapes=((8,),), done=False):
    return {"seq": seq, "comms_id": 0, "op": op, "group": group, "ranks": [0, 1], "peer": peer,
            "tag": 7, "bytes": 0, "shapes": [list(s) for s in shapes],
            "dtypes": ["float32"] * len(shapes), "step": 1, "span": "step", "t_issue": t,
            "t_posted": None, "t_complete": t + 1 if done else None}


def test_merge_takes_p2p_and_waits_from_partuis_dump_and_names_the_source(tmp_path):
    prefix = str(tmp_path / "rank_")
    # torch: rank 1 went on to the world all-reduce; rank 0 shows nothing past the gather (it is
    # blocked in a send torch never recorded)
    write(prefix, 0, [GATHER])
    write(prefix, 1, [GATHER, entry("0", "default_pg", 2, "all_reduce", [[1]], t=400)])
    alone = doctor.verdict(torch_fr.to_dump(prefix))
    assert alone["headline"]["culprits"] == [0]           # what torch's dumps alone can say
    ours = {"format": "partui-flight", "world": 2, "reason": "hang", "absent": [], "ranks": [
        partui_part(0, [prec("send", "pp", 1, 1, 10, done=True), prec("send", "pp", 2, 1, 20)],
                    {"since": 20, "group": "pp", "op": "send", "seq": 2}),
        partui_part(1, [prec("recv", "pp", 1, 0, 11, done=True)])]}
    v = doctor.verdict(merge(torch_fr.to_dump(prefix), ours))
    h = v["headline"]
    assert (h["kind"], h["op"], h["seq"], h["culprits"]) == ("unmatched", "send", 2, [1]), h
    assert v["where"][0]["waiting_on"] == "pp send seq 2"          # partui's, not inferred
    assert v["sources"]["p2p ops"].startswith("partui's dump")
    assert v["sources"]["collectives"] == "torch's flight recorder"
    sent = [r for rk in merge(torch_fr.to_dump(prefix), ours)["ranks"] if rk["rank"] == 0
            for r in rk["records"] if r["op"] == "send"]
    assert [r["t_issue"] for r in sent] == [1_000_000 - 1_000 + 10, 1_000_000 - 1_000 + 20]


def test_merge_fills_a_rank_torch_left_no_dump_of_and_compares_inputs_only(tmp_path):
    prefix = str(tmp_path / "rank_")
    write(prefix, 0, [GATHER, entry("1", "dp", 1, "all_reduce", [[8]], t=200)])
    ours = {"format": "partui-flight", "world": 2, "reason": "abort", "absent": [1], "ranks": [
        # partui keeps a gather's (input, output): torch keeps the input, so only that is compared
        partui_part(1, [prec("all_gather", "world", 1, t=5, shapes=((1,), (2,)), done=True),
                        prec("all_reduce", "dp", 1, t=6, shapes=((4,),))])]}
    ours["ranks"][0]["records"][0]["dtypes"] = ["int64", "int64"]
    v = doctor.verdict(merge(torch_fr.to_dump(prefix), ours))
    h = v["headline"]
    assert (h["kind"], h["group"], h["seq"]) == ("mismatch", "dp", 1), h
    assert {s["rank"]: s["gave"] for s in h["sides"]} == {0: "dp all_reduce seq 1 float32[8]",
                                                          1: "dp all_reduce seq 1 float32[4]"}
    assert v["absent"] == [] and "rank(s) [1]'s ops" in v["sources"]


def test_doctor_with_refuses_the_dumps_in_the_wrong_order(tmp_path, capsys):
    from partui.commands.doctor import add_parser, run
    import argparse
    prefix = str(tmp_path / "rank_")
    write(prefix, 0, [GATHER])
    p = argparse.ArgumentParser().add_subparsers()
    args = add_parser(p).parse_args([prefix, "--with", prefix])
    assert run(args) == 2
    assert "give torch's dumps first and partui's dump after --with" in capsys.readouterr().err
    assert load(prefix)["format"] == "torch-fr"


@pytest.mark.parametrize("at, now, says", [
    ({0: {"waiting": 1, "issued": 2}, 1: {"waiting": 0, "issued": 2}}, 7e9, (0, 7.0 - 1e-9)),
    ({0: {"waiting": 1, "issued": 2}, 1: {"waiting": 0, "issued": 3e9}}, 7e9, None),   # 1 issues
    ({0: {"waiting": 5e9, "issued": 2}, 1: {"waiting": 0, "issued": 2}}, 7e9, None),   # 2 s only
    ({0: {"waiting": 0, "issued": 2}, 1: {"waiting": 0, "issued": 2}}, 9e9, None),     # none waits
])
def test_the_torchrun_stop_rule_is_partuis_own(at, now, says):
    got = stopped(at, int(now))
    if says is None:
        assert got is None
    else:
        assert got[0] == says[0] and got[1] == pytest.approx(says[1], abs=1e-6)
