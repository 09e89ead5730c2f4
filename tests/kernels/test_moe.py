"""MoE gating and layer oracles in one process, float64: routing, capacity, aux loss, backward."""
from dataclasses import replace

import pytest
import torch

from planning.config import make_config

from kernels.weights import init_params
from kernels.engine import Engine
from kernels.ep.build import build_moe
from kernels.ep.routing import capacity, route
from kernels.layers.base import Ctx
from planning.mesh import Plan
from kernels.stats import StepStats

CASES = [(1, None, "uneven"), (2, None, "uneven"), (2, 0.5, "uneven"), (1, 0.7, "even"),
         (2, 0.5, "even"), (2, None, "even")]


def moe_cfg(top_k=2, cf=None, experts=4, batch=4, seq=8, **kw):
    return replace(make_config("tiny", batch=batch, seq=seq), experts=experts, top_k=top_k,
                   capacity_factor=cf, **kw)


def layer(cfg, dispatch="uneven", seed=0):
    t = init_params(cfg, seed, torch.float64)
    moe = build_moe(cfg, "layers.0.moe.", t, None, dispatch=dispatch, stats=StepStats())
    moe.router.data = moe.router.data * 50   # sharper router: uneven load, real drops
    return moe


def routed(moe, x):
    xt = x.reshape(-1, x.shape[-1])
    return route(xt @ moe.router.data.t(), moe.cfg, moe.gs, moe.global_groups)


def scale_experts(moe, by_expert):
    """Expert e multiplies its rows by by_expert(global id e): no weights, pure routing."""
    def run(rows, counts):
        ys = [xc * by_expert(moe.lo + l) for l, xc in enumerate(rows.split(counts))]
        return torch.cat(ys), Ctx(per=[], counts=counts)
    moe.run_experts = run


@pytest.mark.parametrize("top_k,cf,dispatch", CASES)
def test_identity_experts_give_input_times_kept_gate_weight(top_k, cf, dispatch):
    cfg = moe_cfg(top_k, cf)
    moe = layer(cfg, dispatch)
    scale_experts(moe, lambda e: 1.0)
    x = torch.randn(4, 8, cfg.dim, dtype=torch.float64)
    y, _ = moe.forward(x)
    r = routed(moe, x)
    kept_w = (r.w * r.keep).sum(-1)                                  # [T]
    torch.testing.assert_close(y.reshape(-1, cfg.dim), x.reshape(-1, cfg.dim) * kept_w[:, None])
    if cf is not None:
        assert (~r.keep).any(), "the capacity factor should drop some choices here"
        assert (kept_w < 1 - 1e-9).any()


@pytest.mark.parametrize("top_k,cf,dispatch", CASES)
def test_experts_scaled_by_id_prove_every_token_reached_its_expert(top_k, cf, dispatch):
    cfg = moe_cfg(top_k, cf)
    moe = layer(cfg, dispatch)
    scale_experts(moe, lambda e: float(e + 1))
    x = torch.randn(4, 8, cfg.dim, dtype=torch.float64)
    y, _ = moe.forward(x)
    r = routed(moe, x)
    factor = (r.w * r.keep * (r.idx + 1)).sum(-1)                   # [T]
    torch.testing.assert_close(y.reshape(-1, cfg.dim), x.reshape(-1, cfg.dim) * factor[:, None])


def test_capacity_priority_is_top1_choices_first():
    # 4 tokens, 2 experts, top-2, capacity ceil(0.5 * 4 * 2 / 2) = 2 per expert
    cfg = moe_cfg(2, 0.5, experts=2, batch=1, seq=4)
    assert capacity(cfg, 4) == 2
    logits = torch.tensor([[2.0, 1.0], [2.0, 1.0], [1.0, 2.0], [1.0, 2.0]], dtype=torch.float64)
    r = route(logits, cfg, 4, 1)
    # every token's first choice fits; the second choices of tokens 0, 1 lose expert 1's slots
    # to the FIRST choices of the later tokens 2, 3 (token order alone would keep them)
    assert r.keep.tolist() == [[True, False]] * 4
    assert r.idx[:, 0].tolist() == [0, 0, 1, 1]


def test_capacity_drops_later_tokens_of_one_group_only():
    cfg = moe_cfg(1, 0.5, experts=2, batch=2, seq=4)               # cap ceil(0.5*4/2) = 1
    logits = torch.tensor([[3.0, 0.0]] * 8, dtype=torch.float64)   # all want expert 0
    r = route(logits, cfg, 4, 2)
    # one slot per group: the first token of EACH sequence keeps it
    assert r.keep[:, 0].tolist() == [True, False, False, False] * 2


def test_aux_loss_of_a_uniform_router_is_the_coefficient():
    cfg = moe_cfg(2, None)
    logits = torch.zeros(32, 4, dtype=torch.float64)               # P_e = 1/E; f one-hot
    r = route(logits, cfg, 8, 4)
    torch.testing.assert_close(r.aux, torch.tensor(cfg.aux_loss_coef, dtype=torch.float64))


def test_routing_does_not_depend_on_how_the_batch_is_cut():
    cfg = moe_cfg(2, 0.5)
    moe = layer(cfg)
    x = torch.randn(4, 8, cfg.dim, dtype=torch.float64)
    whole = routed(moe, x)
    halves = [routed(moe, h) for h in x.chunk(2)]
    assert torch.equal(whole.keep, torch.cat([h.keep for h in halves]))
    torch.testing.assert_close(whole.aux, halves[0].aux + halves[1].aux)   # partials sum


def check_layer_backward(moe, x):
    """The layer's hand forward and backward (dx, every param's grad) against autograd through the
    same forward, float64; returns the forward's ctx."""
    dy = torch.randn_like(x)
    y, c = moe.forward(x)
    dx = moe.backward_input(c, dy)
    moe.backward_weight(c)
    prms = list(moe.params().values())
    saved = [q.data for q in prms]
    leaves = [d.detach().clone().requires_grad_(True) for d in saved]
    for q, leaf in zip(prms, leaves):
        q.data = leaf
    xa = x.clone().requires_grad_(True)
    try:
        y2, c2 = moe.forward(xa)
        grads = torch.autograd.grad((y2 * dy).sum() + c2.aux_loss, [xa] + leaves)
    finally:
        for q, d in zip(prms, saved):
            q.data = d
    torch.testing.assert_close(y, y2.detach())
    torch.testing.assert_close(dx, grads[0], atol=1e-12, rtol=1e-9)
    for q, g in zip(prms, grads[1:]):
        torch.testing.assert_close(q.grad, g, atol=1e-12, rtol=1e-9, msg=q.name)
    assert moe.router.grad.abs().max() > 0
    return c


@pytest.mark.parametrize("top_k,cf,dispatch", CASES)
def test_hand_backward_matches_autograd_through_the_layer(top_k, cf, dispatch):
    cfg = moe_cfg(top_k, cf)
    check_layer_backward(layer(cfg, dispatch), torch.randn(4, 8, cfg.dim, dtype=torch.float64))


def test_engine_step_reports_expert_load_and_overlap_matches_plain():
    cfg = make_config("tiny", layers=2, batch=4, seq=16)
    res, grads = {}, {}
    for overlap in (False, True):
        eng = Engine(Plan(experts=4, top_k=2, capacity_factor=0.5, overlap=overlap), cfg, optim="sgd")
        res[overlap] = eng.step()
        grads[overlap] = {n: p.grad.clone() for n, p in eng.params.items()}
    for r in res.values():
        tokens = sum(r.extra["moe_tokens_per_expert"])
        assert tokens + r.extra["moe_dropped"] == 2 * 4 * 16 * 2    # layers x tokens x top-k
        assert r.extra["moe_dropped"] > 0 and r.extra["moe_aux_loss"] > 0
    assert res[True].extra["moe_tokens_per_expert"] == res[False].extra["moe_tokens_per_expert"]
    assert abs(res[True].loss - res[False].loss) < 1e-5
    for n, g in grads[False].items():
        torch.testing.assert_close(grads[True][n], g, atol=2e-6, rtol=1e-4, msg=n)


def test_routing_group_must_divide_the_sequence():
    cfg = moe_cfg(2, None, routing_group=5)
    with pytest.raises(ValueError, match="routing group 5 must divide seq 8"):
        layer(cfg)
