"""DeepSeek-V3's MoE in one process, float64: selection (biased, group-limited) against a plain
per-token oracle, gate values free of the bias, the sequence-wise loss's known answer, the hand
backward of the gate / normalised top-k / sequence loss and of the whole layer against autograd,
and bias balancing pulling a skewed router's load level."""
from dataclasses import replace

import pytest
import torch

from planning.config import make_config
from kernels.engine import Engine
from kernels.ep.build import build_moe
from kernels.ep.deepseek import bias_step, gate_backward_deepseek, route_deepseek, select
from kernels.ep.deepseek_layer import DeepSeekMoE
from planning.mesh import Plan
from kernels.stats import StepStats
from kernels.weights import init_params
from test_moe import check_layer_backward


def ds_cfg(top_k=2, groups=1, topk_groups=1, experts=8, alpha=0.1, scale=2.5, shared=1, cf=None,
           batch=4, seq=8):
    return replace(make_config("deepseek-tiny", batch=batch, seq=seq), experts=experts,
                   top_k=top_k, route_groups=groups, route_topk_groups=topk_groups,
                   seq_aux_alpha=alpha, route_scale=scale, shared_experts=shared,
                   capacity_factor=cf)


def oracle_select(scores, bias, k, groups, m):
    """Token by token, in plain Python: the group-limited top-k of s + b."""
    e = scores.shape[1]
    per = e // groups
    out = []
    for s in (scores + bias).tolist():
        gsc = [sum(sorted(s[g * per:(g + 1) * per], reverse=True)[:2]) for g in range(groups)]
        keep = sorted(range(groups), key=lambda g: -gsc[g])[:m]
        cand = [i for i in range(e) if i // per in keep]
        out.append(sorted(cand, key=lambda i: -s[i])[:k])
    return out


@pytest.mark.parametrize("k,groups,m", [(1, 1, 1), (2, 2, 1), (4, 4, 2), (3, 2, 2)])
def test_selection_is_the_group_limited_top_k_of_the_biased_scores(k, groups, m):
    g = torch.Generator().manual_seed(k * 10 + groups)
    scores = torch.rand(64, 8, generator=g, dtype=torch.float64)
    bias = torch.randn(8, generator=g, dtype=torch.float64) * 0.2
    assert select(scores, bias, k, groups, m).tolist() == oracle_select(scores, bias, k, groups, m)


def test_group_limited_routing_by_hand():
    # 4 experts in 2 groups; group 0 = {0, 1} scores 0.9 + 0.1, group 1 = {2, 3} 0.6 + 0.6
    s = torch.tensor([[0.9, 0.1, 0.6, 0.6]], dtype=torch.float64)
    zero = torch.zeros(4, dtype=torch.float64)
    assert select(s, zero, 2, 1, 1).tolist() == [[0, 2]]          # no groups: plain top-2
    assert sorted(select(s, zero, 2, 2, 1)[0].tolist()) == [2, 3]  # group 1 wins: 1.2 > 1.0
    bias = torch.tensor([0.0, 0.3, 0.0, 0.0], dtype=torch.float64)  # now group 0 scores 1.3
    assert select(s, bias, 2, 2, 1).tolist() == [[0, 1]]


def test_gate_values_come_from_the_affinities_not_the_bias():
    cfg = ds_cfg(top_k=2)
    logits = torch.randn(32, 8, dtype=torch.float64)
    bias = torch.linspace(-0.5, 0.5, 8, dtype=torch.float64)
    r = route_deepseek(logits, bias, cfg, 8, 4)
    s = torch.sigmoid(logits)
    want = s.gather(1, r.idx) / s.gather(1, r.idx).sum(-1, keepdim=True) * cfg.route_scale
    torch.testing.assert_close(r.w, want)
    torch.testing.assert_close(r.w.sum(-1), torch.full((32,), cfg.route_scale, dtype=torch.float64))
    plain = route_deepseek(logits, torch.zeros(8, dtype=torch.float64), cfg, 8, 4)
    assert not torch.equal(plain.idx, r.idx), "this bias should move some selections"


def test_sequence_loss_of_uniform_affinities_is_alpha():
    # s / sum s = 1/E everywhere and sum_i f_i = E / (K T) * K T = E, so alpha * sum f_i / E = alpha
    cfg = ds_cfg(top_k=2, alpha=0.3)
    r = route_deepseek(torch.zeros(32, 8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64),
                       cfg, 8, 4)
    torch.testing.assert_close(r.aux, torch.tensor(0.3, dtype=torch.float64))


def test_sequence_loss_by_hand():
    # one sequence of 2 tokens, 2 experts, top-1: token 0 picks 0, token 1 picks 1 -> f = [1, 1]
    cfg = ds_cfg(top_k=1, experts=2, alpha=1.0, scale=1.0)
    logits = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    r = route_deepseek(logits, torch.zeros(2, dtype=torch.float64), cfg, 2, 1)
    s = torch.sigmoid(logits)
    p = (s / s.sum(-1, keepdim=True)).mean(0)                      # P_i over the 2 tokens
    torch.testing.assert_close(r.aux, p.sum())                     # alpha * (1 * P_0 + 1 * P_1)
    assert r.idx.tolist() == [[0], [1]]


@pytest.mark.parametrize("k,groups,m,alpha", [(1, 1, 1, 0.1), (2, 1, 1, 0.0), (2, 2, 1, 0.1),
                                              (4, 4, 2, 0.5)])
def test_gate_backward_matches_autograd(k, groups, m, alpha):
    cfg = ds_cfg(top_k=k, groups=groups, topk_groups=m, alpha=alpha)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(32, 8, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(8, generator=g, dtype=torch.float64) * 0.1
    dw = torch.randn(32, k, generator=g, dtype=torch.float64)
    r = route_deepseek(logits, bias, cfg, 8, 4)
    want, = torch.autograd.grad((r.w * dw).sum() + r.aux, logits)
    got = gate_backward_deepseek(r, dw)
    torch.testing.assert_close(got, want, atol=1e-13, rtol=1e-10)


def deepseek_layer(cfg, dispatch="uneven"):
    t = init_params(cfg, 0, torch.float64)
    moe = build_moe(cfg, "layers.0.moe.", t, None, dispatch=dispatch, stats=StepStats())
    moe.router.data = moe.router.data * 50                         # sharper router
    moe.bias = torch.linspace(-0.05, 0.05, cfg.experts)            # a bias that moves selections
    return moe


@pytest.mark.parametrize("k,groups,m,cf,dispatch", [(2, 2, 1, None, "uneven"),
                                                    (1, 1, 1, None, "even"),
                                                    (2, 4, 2, 0.5, "uneven"),
                                                    (4, 2, 2, 0.75, "even")])
def test_layer_hand_backward_matches_autograd(k, groups, m, cf, dispatch):
    cfg = ds_cfg(top_k=k, groups=groups, topk_groups=m, cf=cf)
    moe = deepseek_layer(cfg, dispatch)
    assert isinstance(moe, DeepSeekMoE) and moe.shared is not None
    assert {"shared.w1.weight", "shared.w3.weight", "shared.w2.weight"} <= set(moe.params())
    c = check_layer_backward(moe, torch.randn(4, 8, cfg.dim, dtype=torch.float64))
    if cf is not None:
        assert (~c.r.keep).any(), "the capacity should drop some choices here"


def test_layer_output_is_shared_plus_gated_experts():
    """Identity routed experts: y = shared(x) + x * (sum of kept gate values)."""
    cfg = ds_cfg(top_k=2, groups=2, topk_groups=1)
    moe = deepseek_layer(cfg)
    moe.run_experts = lambda rows, counts: (rows, None)
    x = torch.randn(4, 8, cfg.dim, dtype=torch.float64)
    y, c = moe.forward(x)
    shared, _ = moe.shared.forward(x.reshape(-1, cfg.dim))
    gates = c.r.w.sum(-1)                                          # dropless: every choice kept
    torch.testing.assert_close(y.reshape(-1, cfg.dim), shared + x.reshape(-1, cfg.dim) * gates[:, None])


def test_bias_step_moves_against_the_load():
    b = bias_step(torch.zeros(4), torch.tensor([10.0, 2.0, 4.0, 4.0]), 0.5)   # mean 5
    assert b.tolist() == [-0.5, 0.5, 0.5, 0.5]
    assert bias_step(b, torch.tensor([5.0] * 4), 0.5).tolist() == b.tolist()  # level: no move


def skewed_layer(gamma):
    """One DeepSeek layer whose router sends every token to expert 0: inputs share a direction c
    and expert 0's router row is 4 c / |c|^2, so s_0 = sigmoid(4 + noise) ~ 0.98 against ~0.5."""
    cfg = replace(ds_cfg(top_k=2, groups=1, alpha=0.0, scale=1.0, batch=8, seq=32),
                  balance="bias", bias_gamma=gamma)
    moe = build_moe(cfg, "layers.0.moe.", init_params(cfg, 0, torch.float64), None,
                    stats=StepStats())
    g = torch.Generator().manual_seed(5)
    c = torch.randn(cfg.dim, generator=g, dtype=torch.float64)
    moe.router.data[0] = 4 * c / c.dot(c)
    return moe, cfg, c, g


def balancing_run(gamma, steps=50):
    """Max violation (max load / mean load - 1) of every step, each on fresh tokens."""
    moe, cfg, c, g = skewed_layer(gamma)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)     # 100 small forwards: threads only fight the other tests' ranks
    try:
        violations = [step_of(moe, cfg, c, g) for _ in range(steps)]
    finally:
        torch.set_num_threads(threads)
    return violations, moe, c + torch.randn(8, 32, cfg.dim, generator=g, dtype=torch.float64)


def step_of(moe, cfg, c, g) -> float:
    """One step on fresh tokens: its max violation, then the bias update from its load."""
    moe.forward(c + torch.randn(8, 32, cfg.dim, generator=g, dtype=torch.float64))
    fig = moe.load.take()["moe_layers"]["0"]
    moe.balance(fig["chosen_per_expert"])
    return fig["max_violation"]


def test_bias_balancing_halves_a_skewed_routers_max_violation_in_50_steps():
    violations, moe, x = balancing_run(gamma=0.01)
    still, _, _ = balancing_run(gamma=0.0)                          # the same run, no balancing
    assert violations[0] == still[0] > 2.5          # expert 0 takes nearly every token's 1st choice
    assert max(still[-10:]) > 2.5                                  # no bias: the skew stays
    assert max(violations[-10:]) <= violations[0] / 2, violations
    assert moe.bias[0] == moe.bias.min() < 0 < moe.bias.max()      # expert 0 pushed down
    # the gates stay bias-free: w = s[idx] / sum s[idx] (route_scale 1), though idx moved
    xt = x.reshape(-1, moe.cfg.dim)
    r = moe.route(xt @ moe.router.data.t())
    s = torch.sigmoid(xt @ moe.router.data.t())
    torch.testing.assert_close(r.w, s.gather(1, r.idx) / s.gather(1, r.idx).sum(-1, keepdim=True))
    unbiased = select(s, torch.zeros_like(moe.bias), 2, 1, 1)
    assert (unbiased[:, 0] == 0).all() and not torch.equal(unbiased, r.idx)
