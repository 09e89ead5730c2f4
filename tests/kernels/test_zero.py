"""ZeRO-1/2/3 end to end against the single-process reference (--check: every gradient
element within 2e-5 of the dense fp32 reference, loss too), and the flat layout's bookkeeping."""
import pytest
import torch
import torch.distributed as dist

import kernels.engine as engine
from conftest import check_plan
from kernels.check import Reference, compare_pieces
from planning.config import make_config
from kernels.dp.buckets import FlatUnit, flat_blocks, global_pieces
from kernels.dp.zero import layer_key
from kernels.layers import Param
from planning.mesh import Plan
from worlds import run_world

PAD_MODEL = ("--dim", 40, "--heads", 4, "--kv-heads", 2)   # block numel 18320: not divisible by 3


@pytest.mark.timeout(300)
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_every_stage_dp2_adamw(zero):
    s = check_plan("--dp", 2, "--zero", zero, "--optim", "adamw", "--bucket-mb", 0.1, steps=5)
    assert s["max_abs_grad_err"] <= 2e-5
    assert all(r["ledger"]["stage"] == zero for r in s["ranks"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("zero,optim", [(1, "sgd"), (3, "sgd"), (2, "adamw")])
def test_dp4(zero, optim):
    check_plan("--dp", 4, "--zero", zero, "--optim", optim, "--bucket-mb", 0.1, steps=5)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("zero,optim", [(2, "adamw"), (3, "sgd")])
def test_padding_when_sizes_do_not_divide_the_world(zero, optim):
    s = check_plan("--dp", 3, "--batch", 6, *PAD_MODEL, "--zero", zero, "--optim", optim,
                   "--bucket-mb", 0.05, steps=5)
    led = s["ranks"][0]["ledger"]
    assert led["psi_padded"] > led["psi"] and led["matches_formula"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("zero", [2, 3])
def test_gradient_accumulation(zero):
    check_plan("--dp", 2, "--zero", zero, "--microbatches", 2, "--bucket-mb", 0.1, steps=3)


def test_flat_blocks_cover_the_range_in_order():
    shape = (5, 3, 4)
    for a, b in [(0, 60), (7, 8), (5, 43), (12, 24), (13, 59)]:
        idx = torch.arange(60).reshape(shape)
        got = torch.cat([idx[tuple(slice(s, e) for s, e in box)].reshape(-1)
                         for box in flat_blocks(shape, a, b)])
        assert got.tolist() == list(range(a, b))


def test_global_pieces_of_a_tensor_parallel_shard():
    full = torch.arange(8 * 6).reshape(8, 6)
    prm = Param("w", full[2:5, 3:6].clone(), global_shape=(8, 6), shard=(slice(2, 5), slice(3, 6)))
    pieces = global_pieces(prm, (3, 3), 1, 8)     # local elements 1..7 of the 3x3 shard
    got = torch.cat([full[tuple(slice(s, e) for s, e in idx)].reshape(-1) for _, idx in pieces])
    assert got.tolist() == prm.data.reshape(-1)[1:8].tolist()
    assert global_pieces(Param("v", torch.zeros(4)), (4,), 1, 3) == [("flat", [1, 3])]


def test_flat_unit_pads_to_the_group():
    class G:
        name, size, ranks = "dp", 4, [0, 1, 2, 3]
    unit = FlatUnit(0, G(), [("a", Param("a", torch.zeros(3, 3))), ("b", Param("b", torch.zeros(2)))],
                    pad_to=4)
    assert (unit.numel, unit.padded, unit.chunk, unit.offsets) == (11, 12, 3, [0, 9])


def test_layer_keys():
    assert layer_key("layers.3.attn.wq.weight") == "layers.3"
    assert layer_key("layers.1.moe.w1") == "layers.1"
    assert layer_key("embed.weight") == "embed"
    assert layer_key("lm_head.weight") == layer_key("norm.weight") == "head"


# ---------------------------------------------------------------- mixed precision (bf16)
# The engine builds fp32 layers today; these ranks build them in bf16 (what `--dtype bf16`
# needs from kernels/engine.py) and hold ZeRO's sharded fp32 master/Adam to the single-process
# mixed-precision reference: the same bf16 model with fp32 master weights and Adam state.
BF16_GRAD_ATOL = 3e-2     # the old absolute bf16 bound of --check (now partui.world.checker holds bf16 to its own rounding); seen: 1e-3 to 2e-3
BF16_GRAD_RTOL = 0.05     # max error / max |grad| of a tensor, bf16 has 8 mantissa bits


def _bf16_rank(rank, world, zero):
    """Rank `rank`'s bf16 engine against the mixed reference: per step (max abs grad err,
    max |grad|, loss err, missing pieces), and the ledger."""
    init, build = engine.init_params, engine.build_model
    engine.init_params = lambda cfg, seed, dtype=None: init(cfg, seed, torch.bfloat16)
    engine.build_model = lambda cfg, seed, dtype=None, *a, **k: build(cfg, seed, torch.bfloat16,
                                                                       *a, **k)
    cfg = make_config("tiny", layers=2)
    eng = engine.Engine(Plan(dp=world, zero=zero, dtype="bf16", bucket_mb=0.05), cfg, rank)
    ref = Reference(eng.plan, cfg, dtype=torch.bfloat16)
    errs = []
    for _ in range(3):
        res = eng.step()
        mine = [None] * world
        dist.all_gather_object(mine, eng.grad_pieces())
        ref_loss, ref_grads = ref.step()
        cmp = compare_pieces(mine, {n: g.float() for n, g in ref_grads.items()})
        scale = max(g.float().abs().max().item() for g in ref_grads.values())
        errs.append((cmp["max_abs_err"], scale, abs(res.loss - ref_loss), cmp["missing"]))
    return errs, eng.sync.ledger()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("zero", [0, 2, 3])
def test_bf16_mixed_precision_matches_the_mixed_reference(zero):
    errs, led = run_world(2, _bf16_rank, zero, timeout_s=240)[0]   # forked: the bf16 patch stays in the ranks
    print(f"ZeRO-{zero} bf16 (max abs grad err, max |grad|, loss err, missing) per step:", errs)
    for err, scale, loss_err, missing in errs:
        assert not missing
        assert err <= BF16_GRAD_ATOL and err <= BF16_GRAD_RTOL * scale, (err, scale)
        assert loss_err <= 3e-2
    # the paper's mixed-precision ledger: 2 + 2 + 12 bytes per element, sharded by stage
    psi, n = led["psi"], 2
    want = {0: 16 * psi, 2: 2 * psi + 14 * psi // n, 3: 16 * psi // n}[zero]
    assert led["total"] == want and led["matches_formula"], led
