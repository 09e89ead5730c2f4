"""Plans validated before anything launches; coordinates and groups on the grid. No processes."""
import pytest

from planning.mesh import Plan, PlanError, coord_label, coords, partition, rank_of
from planning.validate import validate
from planning.config import make_config

TINY = make_config("tiny")

BAD = [  # (plan kwargs, model overrides, world, words the message must contain)
    (dict(tp=3), {}, None, ["tp 3", "4 heads", "pick tp in 1, 2, 4"]),
    (dict(dp=2, tp=2), {}, 6, ["world 6", "dp 2 x tp 2", "= 4", "set world=4"]),
    (dict(tp=2, pp=2), {}, 6, ["world 6", "not divisible", "tp 2 x cp 1 x pp 2 = 4"]),
    (dict(zero=4, dp=2), {}, None, ["unknown ZeRO stage 4", "pick zero in 0, 1, 2, 3"]),
    (dict(zero=1), {}, None, ["ZeRO-1", "dp = 1", "dp=2"]),
    (dict(dp=2, bucket_mb=0), {}, None, ["bucket size 0", "> 0"]),
    (dict(dp=3), {}, None, ["global batch 8", "dp 3"]),
    (dict(microbatches=3), {}, None, ["per-rank batch 8", "3 microbatches", "1, 2, 4, 8"]),
    (dict(tp=4), dict(kv_heads=4, heads=4, vocab=254), None, ["vocab 254", "tp 4"]),
    (dict(tp=2, sp=True), dict(seq=31), None, ["seq 31", "tp 2"]),
    (dict(sp=True), {}, None, ["sp (sequence parallel)", "tp=2"]),
    (dict(pp=3), {}, None, ["4 layers", "3 pipeline stages"]),
    (dict(pp=2, schedule="warp"), {}, None, ["unknown schedule 'warp'", "pick schedule in gpipe, 1f1b"]),
    (dict(pp=3, schedule="dualpipe", microbatches=8), dict(layers=6), None,
     ["even number of pipeline ranks", "pp 3"]),
    (dict(pp=2, schedule="dualpipe", microbatches=2), {}, None, [">= 2 x pp = 4", "got 2"]),
    (dict(pp=4, schedule="1f1b", microbatches=2), {}, None, [">= pp = 4", "got 2", "microbatches=4"]),
    (dict(pp=2, schedule="interleaved", microbatches=2, virtual_stages=1), {}, None,
     ["virtual_stages 2 or more"]),
    (dict(pp=2, schedule="interleaved", microbatches=8, virtual_stages=4), {}, None,
     ["4 layers", "8 pipeline stages"]),
    (dict(cp=2), dict(seq=31), None, ["seq 31", "cp 2"]),
    (dict(cp=2, cp_mode="zigzag"), dict(seq=34), None, ["seq 34", "4", "zigzag"]),
    (dict(cp=4, cp_mode="ulysses"), {}, None, ["Ulysses", "kv heads", "cp 4", "cp_mode=ring"]),
    (dict(tp=2, cp=2, cp_mode="ulysses"), {}, None, ["Ulysses", "1 kv heads per tp rank"]),
    (dict(cp=2, cp_mode="spiral"), {}, None, ["unknown cp mode 'spiral'"]),
    (dict(ep=2, dp=2), {}, None, ["ep 2 needs an MoE model", "set experts=4"]),
    (dict(ep=3, dp=3, experts=4), dict(batch=6), None, ["4 experts not divisible by ep 3"]),
    (dict(ep=4, dp=2, experts=4), {}, None, ["ep 4 must divide dp 2"]),
    (dict(experts=4, top_k=5), {}, None, ["top-k 5", "4 experts"]),
    (dict(experts=4, capacity_factor=-1.0), {}, None, ["capacity factor -1.0", "> 0"]),
    (dict(dtype="fp8"), {}, None, ["unknown dtype 'fp8'", "pick dtype in fp32, bf16"]),
    (dict(tp=0), {}, None, ["tp 0 must be >= 1", "set tp=1"]),
    (dict(overlap=True), {}, None, ["overlap splits MoE", "needs experts"]),
    (dict(collectives="mpi"), {}, None, ["unknown collectives 'mpi'"]),
    (dict(experts=4, cp=2), {}, None, ["MoE with context parallel", "set cp=1 or experts=0"]),
    (dict(tp=2, sp=True, experts=4), {}, None, ["sp (sequence parallel)", "MoE", "set sp=False or experts=0"]),
    (dict(tp=2, sp=True, cp=4), dict(seq=36), None, ["seq 36 / cp 4", "multiple of 8", "seq=40"]),
    (dict(tp=6), dict(heads=12, kv_heads=4, dim=96), None,   # not 12: vocab 256 refuses it
     ["pick tp in 1, 2, 4", "(replicated)"]),
    (dict(experts=4, ep=2, overlap=True), dict(batch=2), None,
     ["overlap runs microbatches in pairs", "per-rank batch 1"]),
    (dict(experts=4, ep_dispatch="random"), {}, None, ["unknown EP dispatch 'random'"]),
    (dict(dp=2, zero=3, pp=2, schedule="zb1p", microbatches=4), {}, None,
     ["ZeRO-3", "zb1p defers the weight grads", "zero=2"]),
]


@pytest.mark.parametrize("kw,model,world,words", BAD, ids=[str(b[0]) for b in BAD])
def test_invalid_plans_name_numbers_and_fix(kw, model, world, words):
    cfg = make_config("tiny", **model)
    with pytest.raises(PlanError) as e:
        validate(Plan(**kw), cfg, world)
    for w in words:
        assert w in str(e.value), f"{w!r} not in {e.value}"


def test_dp_derived_from_world():
    plan = validate(Plan(tp=2, pp=2, microbatches=2), TINY, 8)
    assert (plan.dp, plan.world) == (2, 8)
    assert validate(Plan(), TINY, None).world == 1
    assert validate(Plan(experts=4, ep=2), TINY, None).dp == 2  # ep is carved out of dp


def test_tp_innermost_pp_outermost():
    plan = validate(Plan(dp=2, tp=2, pp=2, microbatches=2), TINY)
    assert [coords(plan, r)["tp"] for r in range(4)] == [0, 1, 0, 1]
    assert [coords(plan, r)["pp"] for r in range(8)] == [0] * 4 + [1] * 4
    assert all(rank_of(plan, coords(plan, r)) == r for r in range(8))
    assert coord_label(plan, 5) == "dp0 tp1 pp1"


def test_groups_partition_the_world():
    plan = validate(Plan(dp=2, tp=2, cp=2, microbatches=1), make_config("tiny"))
    for dim in ("tp", "cp", "dp", "pp", "cp_dp"):
        groups = partition(plan, dim)
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(plan.world)), dim
        size = {"tp": 2, "cp": 2, "dp": 2, "pp": 1, "cp_dp": 4}[dim]
        assert all(len(g) == size for g in groups), dim
    assert partition(plan, "tp")[0] == [0, 1]
    assert partition(plan, "cp")[0] == [0, 2]


def test_ep_carved_out_of_dp():
    plan = validate(Plan(dp=4, experts=4, ep=2), TINY)
    assert partition(plan, "ep") == [[0, 1], [2, 3]]
    assert partition(plan, "ep_dp") == [[0, 2], [1, 3]]


def test_stages_derived_from_schedule():
    assert Plan(pp=2, schedule="dualpipev").stages == 4
    assert Plan(pp=2, schedule="interleaved", virtual_stages=2).stages == 4
    assert Plan(pp=4, schedule="dualpipe").stages == 4
