"""The flight recorder's pieces on known answers: every op's identity (Seq, Comms Id) the same on
every rank of it and in the trace, the doctor's verdict on hand-built dumps, the shared rows a dead
rank leaves, torch's own dumps read, and --fault / --validate-comms refused or caught at once."""
import json
import os
import pickle
from multiprocessing.sharedctypes import RawArray

import pytest
import torch
from conftest import run_cli
from worlds import run_world

from kernels import comm
from kernels.comm import flight
from partui.diagnosis import doctor, torch_fr
from partui.commands.doctor import load
from partui.diagnosis.flight_gather import stopped
from planning import flight_codes
from planning.fault_spec import FaultError, parse_fault

pytestmark = pytest.mark.timeout(180)


def rec(rank, group, op, seq, shape=(8,), dtype="float32", ranks=(0, 1), done=True, t=0, peer=None,
        tag=0):
    return {"seq": seq, "comms_id": 0, "op": op, "group": group, "ranks": list(ranks), "peer": peer,
            "tag": tag, "bytes": 0, "shapes": [list(shape)], "dtypes": [dtype], "step": 1,
            "span": "B block 0", "t_issue": t or seq * 1000 + rank, "t_posted": None,
            "t_complete": (t or seq * 1000) + 500 if done else None}


def dump(*ranks):
    return {"format": "partui-flight", "world": len(ranks), "reason": "test", "absent": [],
            "ranks": [{"rank": r, "step": 1, "span": f"span {r}", "waiting": w, "groups": {},
                       "records": recs} for r, recs, w in ranks]}


# ---------------------------------------------------------------- the doctor, by hand

def test_a_rank_that_never_entered_is_named_with_where_it_is():
    wait = {"since": 1, "group": "dp", "op": "all_reduce", "seq": 3}
    d = dump((0, [rec(0, "dp", "all_reduce", 1), rec(0, "dp", "all_reduce", 2),
                  rec(0, "dp", "all_reduce", 3, done=False)], wait),
             (1, [rec(1, "dp", "all_reduce", 1), rec(1, "dp", "all_reduce", 2)], None))
    v = doctor.verdict(d)
    h = v["headline"]
    assert (h["kind"], h["group"], h["op"], h["seq"]) == ("hang", "dp", "all_reduce", 3)
    assert h["entered"] == [0] and h["missing"] == [1] and h["culprits"] == [1]
    assert v["where"][1]["last_completed"] == "dp all_reduce seq 2 float32[8]"
    text = "\n".join(doctor.render(v))
    assert "rank 1 is at step 1, span span 1, last completed dp all_reduce seq 2" in text


def test_a_mismatch_names_both_sides_and_the_minority_as_culprit():
    members = (0, 1, 2, 3)
    d = dump(*[(r, [rec(r, "dp", "all_reduce", 1, ranks=members,
                        shape=(4,) if r == 2 else (8,), done=False)], None) for r in members])
    h = doctor.verdict(d)["headline"]
    assert (h["kind"], h["seq"], h["culprits"]) == ("mismatch", 1, [2])
    assert {s["rank"]: s["gave"] for s in h["sides"]}[2] == "dp all_reduce seq 1 float32[4]"
    # two ranks: no majority, both are named
    d2 = dump((0, [rec(0, "tp", "all_reduce", 1, dtype="float64")], None),
              (1, [rec(1, "tp", "all_reduce", 1)], None))
    assert doctor.verdict(d2)["headline"]["culprits"] == [0, 1]


def test_all_to_all_splits_may_differ_but_dtypes_may_not():
    ok = dump((0, [rec(0, "ep", "all_to_all", 1, shape=(6, 4))], None),
              (1, [rec(1, "ep", "all_to_all", 1, shape=(2, 4))], None))
    assert doctor.verdict(ok)["headline"]["kind"] == "ok"
    bad = dump((0, [rec(0, "ep", "all_to_all", 1, dtype="bfloat16")], None),
               (1, [rec(1, "ep", "all_to_all", 1)], None))
    assert doctor.verdict(bad)["headline"]["kind"] == "mismatch"


def test_a_hang_is_followed_to_the_unmatched_send_behind_it():
    # rank 0 blocks in its 2nd send to 1 (never received), so it never enters the world op 1 is in
    w0 = {"since": 1, "group": "pp", "op": "send", "seq": 2}
    d = dump((0, [rec(0, "pp", "send", 1, peer=1), rec(0, "pp", "send", 2, peer=1, done=False)], w0),
             (1, [rec(1, "pp", "recv", 1, peer=0),
                  rec(1, "world", "all_reduce", 1, done=False)], None))
    v = doctor.verdict(d)
    h = v["headline"]
    assert (h["kind"], h["group"], h["op"], h["seq"], h["culprits"]) == ("unmatched", "pp", "send",
                                                                         2, [1])
    assert any(f["kind"] == "hang" and f["missing"] == [0] for f in v["findings"])


def test_two_groups_entered_in_opposite_orders_are_a_deadlock():
    w0 = {"since": 1, "group": "ep", "op": "all_to_all", "seq": 1}
    w1 = {"since": 1, "group": "dp", "op": "barrier", "seq": 1}
    d = dump((0, [rec(0, "ep", "all_to_all", 1, done=False)], w0),
             (1, [rec(1, "dp", "barrier", 1, done=False)], w1))
    h = doctor.verdict(d)["headline"]
    assert h["kind"] == "deadlock" and h["culprits"] == [0, 1]
    assert len(h["cycle"]) == 2 and "deadlock" in doctor.render(doctor.verdict(d))[1]


def test_no_fault_gives_the_entry_spread_and_the_last_rank():
    d = dump((0, [rec(0, "dp", "all_reduce", 1, t=1_000_000)], None),
             (1, [rec(1, "dp", "all_reduce", 1, t=3_500_000)], None))
    h = doctor.verdict(d)["headline"]
    assert (h["kind"], h["culprits"], h["spread_ms"]) == ("ok", [1], 2.5)


def test_lateness_is_blamed_where_it_began_not_on_its_victim():
    # rank 1 sends 2 s late; rank 0, its receiver, then enters the next collective last
    d = dump((0, [rec(0, "pp", "recv", 1, peer=1, t=1_000_000),
                  rec(0, "world", "all_reduce", 1, t=2_600_000_000)], None),
             (1, [rec(1, "pp", "send", 1, peer=0, t=2_001_000_000),
                  rec(1, "world", "all_reduce", 1, t=2_100_000_000)], None))
    h = doctor.verdict(d)["headline"]
    assert (h["kind"], h["group"], h["culprits"], h["spread_ms"]) == ("ok", "pp", [1], 2000.0)


def test_a_stopped_world_needs_a_long_wait_and_nothing_issued():
    world, now = 2, 100 * 10**9
    watch = [0] * (1 + 3 * world)
    watch[1], watch[2] = now - 6 * 10**9, now - 6 * 10**9          # rank 0 blocked 6 s
    watch[5] = now - 7 * 10**9                                      # rank 1 last issued 7 s ago
    assert stopped(watch, world, now) == 0
    watch[5] = now - 1 * 10**9                                      # rank 1 still issuing: slow
    assert stopped(watch, world, now) is None


# ---------------------------------------------------------------- shared rows

def test_shared_rows_round_trip_and_keep_the_newest():
    shared = RawArray("q", flight_codes.BLOCK)       # the controller's kind of shared memory
    fr = flight.FlightRecorder()
    fr.attach_mirror(shared, 0)

    class R:  # an OpRecord's fields, as the door fills them
        def __init__(self, i):
            self.op, self.group, self.peer, self.tag, self.nbytes = "all_reduce", "dp", None, 0, 32
            self.shapes, self.dtypes, self.t_issue, self.t_complete, self.slot = ((8,),), ("float32",), i, None, -1

    recs = [R(i + 1) for i in range(flight_codes.MIRROR_ROWS + 3)]
    for r in recs:
        fr.identify(r, [0, 3], 0)
    recs[-1].t_complete = 99
    fr.completed(recs[-1])
    back = flight_codes.decode(shared)
    assert len(back) == flight_codes.MIRROR_ROWS
    assert [b["seq"] for b in back] == list(range(4, flight_codes.MIRROR_ROWS + 4))
    assert back[-1] | {} == back[-1] and back[-1]["t_complete"] == 99 and back[-2]["t_complete"] is None
    assert back[-1]["ranks"] == [0, 3] and back[-1]["shapes"] == [[8]] and back[-1]["group"] == "dp"


# ---------------------------------------------------------------- identity through the door

def _identity_world(rank, size):
    comm.set_validate(False)
    dp = comm.new_groups("dp", [[0, 1]])
    flight.recorder.clear()
    t = torch.ones(4)
    comm.all_reduce(t, dp)
    comm.all_reduce(t, dp, async_op=True).wait()
    comm.broadcast(t, 0, dp)
    if rank == 0:   # both posted before either is waited: gloo's send waits for its recv
        comm.wait_all([comm.isend(t, 1, dp), comm.isend(t, 1, dp, tag=5)])
    else:
        comm.recv(t, 0, dp, tag=5)   # posted in the other order: the tag still pairs them
        comm.recv(t, 0, dp)
    return [(r.op, r.group, r.seq, r.comms_id, r.shapes, r.dtypes, r.tag)
            for r in flight.recorder.records()]


def test_every_op_gets_the_same_seq_and_comms_id_on_every_rank():
    a, b = run_world(2, _identity_world, timeout_s=60)
    coll = [x for x in a if x[0] not in ("send", "recv")]
    assert coll == [x for x in b if x[0] not in ("send", "recv")]
    assert [x[2] for x in coll] == [1, 2, 3]
    assert len({x[3] for x in coll}) == 3
    sends = {(x[6], x[2]): x[3] for x in a if x[0] == "send"}
    recvs = {(x[6], x[2]): x[3] for x in b if x[0] == "recv"}
    assert sends == recvs and len(sends) == 2
    assert coll[0][4:6] == (((4,),), ("float32",))


def _mismatch_world(rank, size):
    comm.set_validate(True)
    dp = comm.new_groups("dp", [[0, 1]])
    t = torch.ones(4 if rank == 0 else 6)
    try:
        comm.all_reduce(t, dp)
    except RuntimeError as e:
        return str(e)
    finally:
        comm.set_validate(False)
    return "no error"


def test_validate_comms_fails_at_once_naming_both_ranks():
    msgs = run_world(2, _mismatch_world, timeout_s=120)
    for m in msgs:
        assert "dp all_reduce seq 1 differs between ranks 0 and 1" in m
        assert "rank 0 gave all_reduce seq 1 float32[4]" in m and "rank 1 gave all_reduce seq 1 float32[6]" in m


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("spec, says", [
    ("skip", "give KIND@STEP:RANK"), ("jump@1:0", "unknown kind 'jump'"),
    ("skip@x:0", "must be whole numbers"), ("skip@5:0", "step 5 is outside the run's steps (0..2)"),
    ("skip@1:4", "rank 4 is outside the world (0..1)")])
def test_a_fault_that_cannot_be_is_refused_naming_a_fix(spec, says):
    with pytest.raises(FaultError, match=r"--fault " + spec.replace("@", "@")) as e:
        parse_fault(spec, world=2, steps=3)
    assert says in str(e.value) and "pick" in str(e.value) or "e.g." in str(e.value)
    assert parse_fault("late@2:1", 2, 3) == ("late", 2, 1)


def test_doctor_refuses_what_is_no_dump(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ValueError, match="not a partui flight dump"):
        load(str(p))
    with pytest.raises(ValueError, match="neither a partui flight dump"):
        load(str(tmp_path / "missing"))


# ---------------------------------------------------------------- torch's own recorder

def _torch_fr_world(rank, size, prefix):
    import torch.distributed as dist
    g = dist.new_group([0, 1], group_desc="dp")
    t = torch.ones(8 if rank == 0 else 4)
    dist.all_reduce(torch.ones(2), group=g)
    if rank == 1:        # rank 1 enters a second collective rank 0 never enters: dumped mid-air
        dist.all_reduce(t, group=g, async_op=True)
    dump_bytes = torch._C._distributed_c10d._dump_fr_trace(includeCollectives=True,
                                                           includeStackTraces=False,
                                                           onlyActive=False)
    with open(f"{prefix}{rank}", "wb") as f:
        f.write(dump_bytes)
    return len(pickle.loads(dump_bytes)["entries"])


def test_torch_flight_recorder_dumps_read_with_the_same_verdict(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "100")
    prefix = str(tmp_path / "fr_")
    counts = run_world(2, _torch_fr_world, prefix, timeout_s=120)
    assert counts == [1, 2]
    assert torch_fr.is_torch_dump(prefix)
    v = doctor.verdict(load(prefix))
    h = v["headline"]
    assert (h["kind"], h["group"], h["op"], h["seq"], h["missing"]) == ("hang", "dp", "all_reduce",
                                                                          2, [0])
    assert os.path.exists(prefix + "0")


# ---------------------------------------------------------------- the trace carries the identity

def test_every_comm_event_of_a_trace_carries_its_identity_the_same_on_every_rank(tmp_path):
    path = str(tmp_path / "pp.json")
    proc = run_cli("run", "--pp", 2, "--dp", 2, "--microbatches", 2, "--steps", 2, "--layers", 2,
                   "--collectives", "hand", "--trace", path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "comm"]
    assert events
    ranks_of: dict = {}
    for e in events:
        a = e["args"]
        assert isinstance(a["Process Group Name"], str) and a["Seq"] >= 1, a
        assert a["Comms Id"] == flight.comms_id(a["Process Group Name"], a["Seq"], _direction(e)), a
        if "parent" not in a and a["op"] not in ("send", "recv"):
            ranks_of.setdefault(a["Comms Id"], set()).add(e["pid"])
    # a dp collective of 2 ranks, the world's of 4: every member recorded the same Comms Id
    assert {len(r) for r in ranks_of.values()} <= {2, 4} and any(len(r) == 4 for r in ranks_of.values())


def _direction(e) -> str:
    """The p2p part of a Comms Id: src->dst:tag (empty for a collective)."""
    a = e["args"]
    if a["op"] not in ("send", "recv"):
        return ""
    me = e["pid"]
    src, dst = (me, a["peer"]) if a["op"] == "send" else (a["peer"], me)
    return f"{src}->{dst}:{a['tag']}"


@pytest.mark.parametrize("flags, says", [
    (["--fault", "skip@9:0"], "--fault skip@9:0: step 9 is outside the run's steps (0..2)"),
    (["--fault", "skip@1:2"], "--fault skip@1:2: rank 2 is outside the world (0..1)"),
    (["--flight-dump", "/nonexistent-dir/f.json"], "--flight-dump /nonexistent-dir/f.json: folder")])
def test_run_refuses_a_bad_fault_or_dump_path_in_one_line_before_launch(flags, says):
    proc = run_cli("run", "--dp", 2, "--steps", 3, *flags, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert says in proc.stderr
