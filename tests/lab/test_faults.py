"""Each fault on purpose (--fault KIND@STEP:RANK) in three plans, a pipeline and an EP plan among
them, diagnosed by the flight recorder: group, op, Seq and the culprit rank; a mismatch caught at
once, a hang named within 10 s of the world's last op, and no rank process left running."""
import json
import os

import pytest

from partui.diagnosis.doctor import verdict
from partui.world.launch import RankError
from partui.world.world import World

pytestmark = pytest.mark.timeout(300)

PLANS = {
    "dp": {"dp": 2, "bucket_mb": 0.3},
    "pp x dp": {"pp": 2, "dp": 2, "microbatches": 2, "bucket_mb": 0.1},
    "ep": {"ep": 2, "experts": 4, "bucket_mb": 0.1},
    "pp": {"pp": 2, "microbatches": 2, "schedule": "gpipe"},
    "pp x ep": {"pp": 2, "ep": 2, "experts": 4, "microbatches": 2},
}
CASES = [(kind, plan) for kind in ("skip", "size", "dtype", "swap", "group-order", "late")
         for plan in ("dp", "pp x dp", "ep")]
CASES += [("drop-recv", plan) for plan in ("pp", "pp x dp", "pp x ep")]


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def faulted_run(kind, plan, tmp_path, steps=3):
    """(the error or None, the dump's verdict, the dump, the rank pids) of a run faulted at step 1
    on rank 1."""
    path = str(tmp_path / "flight.json")
    w = World(timeout_s=90, fault=f"{kind}@1:1", flight_dump=path)
    w.plan("custom", "tiny", layers=2, **PLANS[plan])
    err = None
    try:
        w.launch()
        pids = w.pids()
        try:
            w.step(steps)
        except RankError as e:
            err = e
        if err is None:
            w.doctor("end of run")
    finally:
        w.close()
    with open(path) as f:
        dump = json.load(f)
    return err, verdict(dump), dump, pids


@pytest.mark.parametrize("kind, plan", CASES, ids=[f"{k}-{p}" for k, p in CASES])
def test_each_fault_is_diagnosed(kind, plan, tmp_path):
    err, v, dump, pids = faulted_run(kind, plan, tmp_path)
    h = v["headline"]
    assert not any(_alive(p) for p in pids), "a rank process outlived the world"
    if kind == "late":                      # a straggler: no failure, and it is the last to enter
        assert err is None
        assert h["kind"] == "ok" and h["culprits"] == [1] and h["spread_ms"] >= 1500, h
        return
    assert err is not None, f"{kind} in {plan} did not fail the run"
    assert str(err).count("flight dump:") == 1
    assert 1 in h["culprits"], h
    assert h["op"] and h["seq"] >= 1 and h["group"], h
    if kind in ("size", "dtype", "swap"):
        assert h["kind"] == "mismatch", h
        gave = {s["rank"]: s["gave"] for s in h["sides"]}
        assert gave[0] != gave[1]
        if kind == "dtype":
            assert "float64" in gave[1]
    elif kind == "drop-recv":
        assert (h["kind"], h["op"], h["culprits"]) == ("unmatched", "send", [1]), h
    else:
        assert h["kind"] in ("hang", "mismatch", "deadlock"), h
    if "stopped making progress" in str(err):   # named within 10 s of the last op anywhere
        last = max(r["t_issue"] for rk in dump["ranks"] for r in rk["records"])
        dumped = max(rk.get("t_dump", 0) for rk in dump["ranks"])
        assert 0 < (dumped - last) / 1e9 < 10.0


def test_validate_comms_catches_the_mismatch_at_once_naming_both_ranks(tmp_path):
    w = World(timeout_s=90, fault="size@1:1", validate_comms=True,
              flight_dump=str(tmp_path / "flight.json"))
    w.plan("custom", "tiny", layers=2, dp=2)
    try:
        w.launch()
        with pytest.raises(RankError, match=r"--validate-comms: dp all_reduce seq \d+ differs "
                                            r"between ranks 0 and 1: rank 0 gave all_reduce seq "
                                            r"\d+ float32\[\d+\], rank 1 gave"):
            w.step(3)
    finally:
        w.close()
    assert os.path.exists(tmp_path / "flight.json")
