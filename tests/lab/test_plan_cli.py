"""`partui plan`: every rank's coordinates, groups, stages, shards, experts and ledger without
launching, against a hand-written grid and against the world the same plan actually builds."""
import pytest

from conftest import run_here
from partui.world.world import World

pytestmark = pytest.mark.timeout(300)
TP_PP = ("--dp", 2, "--tp", 2, "--pp", 2, "--microbatches", 2)
EP_DUALPIPEV = ("--dp", 2, "--ep", 2, "--experts", 4, "--pp", 2, "--schedule", "dualpipev",
                "--microbatches", 4)
SAME = ("rank", "label", "coords", "role", "n_params", "ledger", "groups")


def plan_json(*flags):
    proc = run_here("plan", *flags, "--json", check_rc=0)
    return proc.lines[0]


def world_infos(**fields):
    with World(timeout_s=180) as w:
        w.plan("custom", **fields)
        return w.launch()


def test_dp_tp_pp_groups_by_hand_and_as_built():
    out = plan_json(*TP_PP)
    ranks = out["ranks"]
    assert out["plan"]["world"] == 8 and [r["rank"] for r in ranks] == list(range(8))
    # the grid, innermost first tp, cp, dp, pp: rank = tp + 2 dp + 4 pp
    for r in ranks:
        tp, dp, pp = r["rank"] % 2, r["rank"] // 2 % 2, r["rank"] // 4
        assert r["coords"] | {"ep": 0} == {"tp": tp, "cp": 0, "dp": dp, "pp": pp, "ep": 0}
        assert r["groups"]["tp"] == [4 * pp + 2 * dp, 4 * pp + 2 * dp + 1]
        assert r["groups"]["dp"] == [4 * pp + tp, 4 * pp + tp + 2]
        assert r["groups"]["pp"] == [2 * dp + tp, 2 * dp + tp + 4]
        assert f"stage {pp} " in r["role"] and r["experts"] == []
        wq = next(s for s in r["shards"] if s["name"].endswith("attn.wq.weight"))
        assert wq["local_shape"] == [32, 64] and wq["index"][0] == [32 * tp, 32 * tp + 32]
    built = world_infos(dp=2, tp=2, pp=2, microbatches=2)
    assert [{k: r[k] for k in SAME} for r in ranks] == [{k: b[k] for k in SAME} for b in built]


def test_dp_ep_dualpipev_groups_experts_and_ledger_as_built():
    out = plan_json(*EP_DUALPIPEV)
    ranks = out["ranks"]
    assert out["plan"]["world"] == 4
    for r in ranks:
        dp, pp = r["rank"] % 2, r["rank"] // 2
        assert r["groups"]["ep"] == [2 * pp, 2 * pp + 1] and r["groups"]["pp"] == [dp, dp + 2]
        assert r["experts"] == [2 * dp, 2 * dp + 1]             # 4 experts over ep 2
        # DualPipeV: pp rank k holds stages k and 2 pp - 1 - k (a V)
        assert f"stage {pp} " in r["role"] and f"stage {3 - pp} " in r["role"]
        assert r["ledger"]["total"] == sum(r["ledger"][k] for k in ("params", "grads", "optimizer"))
    built = world_infos(dp=2, ep=2, experts=4, pp=2, schedule="dualpipev", microbatches=4)
    assert [{k: r[k] for k in SAME} for r in ranks] == [{k: b[k] for k in SAME} for b in built]


def test_plan_table_and_bad_plan():
    proc = run_here("plan", *TP_PP, check_rc=0)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("dp 2 × tp 2 × pp 2 · 1f1b · world 8")
    assert lines[1].split()[:5] == ["rank", "coords", "dp", "group", "tp"]
    assert lines[2].split()[:6] == ["0", "dp0", "tp0", "pp0", "0,2", "0,1"]
    proc = run_here("plan", "--tp", 3, check_rc=2)
    assert proc.stderr.strip() == "partui plan: tp 3 does not divide 4 heads: pick tp in 1, 2, 4"
