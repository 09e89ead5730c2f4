"""The Block's backward written once in DeepSeek's parts (kernels/block.py), which the TP block, the EP overlap
runner and the pipeline's F&B parts regroup; and the one pair model the parts are planned and priced on
(planning/pipeline/fb_order.py's TwoStreams)."""
from dataclasses import replace

import pytest
import torch

from kernels.model import build_model
from kernels.stats import StepStats
from planning.config import make_config
from planning.pipeline.fb_order import PartCost, pair_order, run_parts


def _block_and_grads(experts: int):
    """Block 1 of a float64 tiny model (MoE with `experts`), an input x and an output grad dy."""
    cfg = make_config("tiny", batch=2, seq=8)
    cfg = replace(cfg, experts=experts, top_k=2) if experts else cfg
    block = build_model(cfg, seed=5, dtype=torch.float64, stats=StepStats()).layers[1]
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, cfg.seq, cfg.dim, generator=gen, dtype=torch.float64)
    dy = torch.randn(2, cfg.seq, cfg.dim, generator=gen, dtype=torch.float64)
    return block, x, dy


def _grads(block) -> dict:
    return {name: prm.grad.clone() for name, prm in block.params().items()}


@pytest.mark.parametrize("experts", [0, 4])
def test_the_parts_in_a_pairs_order_give_the_whole_backward_bit_for_bit(experts):
    block, x, dy = _block_and_grads(experts)
    assert block.is_moe == bool(experts)
    _, ctx = block.forward(x)
    whole_dx = block.backward_input(ctx, dy)
    block.backward_weight(ctx)
    whole = _grads(block)
    for prm in block.params().values():
        prm.grad = None

    _, ctx = block.forward(x)
    if block.is_moe:                                        # COMBINE, MLP, MLP_W, ATTN, ATTN_W
        block.backward_combine(ctx, dy)
        block.mlp.backward_experts(ctx.c_m)
        block.backward_mlp_weight(ctx)
        dx = block.backward_attention(ctx, dy, block.mlp.backward_dispatch(ctx.c_m))
    else:                                                   # MLP, MLP_W, ATTN, ATTN_W
        dm = block.backward_mlp(ctx, dy)
        block.backward_mlp_weight(ctx)
        dx = block.backward_attention(ctx, dy, dm)
    block.backward_attention_weight(ctx)
    assert torch.equal(dx, whole_dx)
    parts = _grads(block)
    assert parts.keys() == whole.keys() and len(whole) == (10 if experts else 9)
    assert all(torch.equal(parts[n], whole[n]) for n in whole)


def test_the_parts_match_autograd_in_float64():
    block, x, dy = _block_and_grads(0)
    _, ctx = block.forward(x)
    dx = block.backward_attention(ctx, dy, block.backward_mlp(ctx, dy))
    block.backward_mlp_weight(ctx)
    block.backward_attention_weight(ctx)
    leaves = {name: prm.data.detach().requires_grad_(True) for name, prm in block.params().items()}
    for name, prm in block.params().items():
        prm.data = leaves[name]
    xa = x.clone().requires_grad_(True)
    with torch.enable_grad():
        y, _ = block.forward(xa)
        got = torch.autograd.grad((y * dy).sum(), [xa, *leaves.values()])
    torch.testing.assert_close(dx, got[0], rtol=1e-10, atol=1e-12)
    for (name, prm), g in zip(block.params().items(), got[1:]):
        torch.testing.assert_close(prm.grad, g, rtol=1e-10, atol=1e-12, msg=name)


def test_a_dense_pair_moves_no_rows_on_the_pair_model():
    """Dense layers issue no all-to-all, so the pair is its parts back to back on unit costs: the forward
    2 x (ATTN + MLP) = 4, the backward 2 x (MLP + MLP_W + ATTN + ATTN_W) = 8. The replay's second copy of
    the clock once waited on transfers dense parts never issue (16)."""
    order = pair_order(["dense", "dense"], ["dense", "dense"])
    timeline = run_parts(order, PartCost())
    assert timeline.comm == [] and timeline.makespan == 12 and timeline.exposed_comm == 0
    assert all(p.kind == "dense" and p.issues is None and p.waits is None for p in order)


def test_pair_order_plans_on_the_costs_it_is_given():
    """One MoE layer a side on a link three times slower than a part (A2A = 3): the four transfers run back
    to back from 0 (B COMBINE costs 0), so 12 is the least the pair can take. Planned on those costs, the
    weight grads fill in under DISPATCH(F) and COMBINE(F) and the pair takes 12, 6 of its 12 comm units under
    compute; planned on unit costs they run last and it takes 14 (8 exposed)."""
    slow_link = PartCost(A2A=3.0)
    planned = pair_order(["moe"], ["moe"], cost=slow_link)
    timeline = run_parts(planned, slow_link)
    assert (timeline.makespan, timeline.exposed_comm) == (12, 6)
    assert [(p.side, p.part) for p in planned] == [
        ("B", "COMBINE"), ("F", "ATTN"), ("B", "MLP"), ("B", "MLP_W"), ("F", "MLP"), ("B", "ATTN"),
        ("B", "ATTN_W"), ("F", "COMBINE")]
    unit_planned = run_parts(pair_order(["moe"], ["moe"]), slow_link)
    assert (unit_planned.makespan, unit_planned.exposed_comm) == (14, 8)
