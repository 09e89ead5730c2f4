"""`--reference autograd` for MoE models: kernels/torch_moe.py writes GShard and DeepSeek-V3 routing
again from their definitions. Its capacity rule and top-k ties on known answers, agreement with the
hand reference in one process (grads, routing counts, drops, DeepSeek's bias), and a matrix of MoE
plans held to it in real worlds (the injected gate-grad errors are in test_autograd_reference.py)."""
import pytest
import torch

from conftest import run_cli
from kernels.check import Reference
from kernels.ep.deepseek import route_deepseek
from kernels.ep.routing import slots
from kernels.torch_moe import MoEBlock, within_capacity
from kernels.torch_reference import TorchReference
from partui.world.plans import build_plan


def test_capacity_fills_slots_in_priority_order():
    # group of 4 tokens, cap 2. 1st choices: t0 t1 t2 -> expert 0 (t2 is 0's third: dropped),
    # t3 -> 1. 2nd choices: t0 -> 1 (1's second: kept), t1 -> 1 (third: dropped), t2 -> 2, t3 -> 0
    # (0's fourth: dropped)
    idx = torch.tensor([[0, 1], [0, 1], [0, 2], [1, 0]])
    want = torch.tensor([[True, True], [True, False], [False, True], [True, False]])
    assert torch.equal(within_capacity(idx, 4, 2, 3), want)
    _, keep = slots(torch.nn.functional.one_hot(idx, 3), 4, 2)      # the hand layers' rule agrees
    assert torch.equal(keep, want)
    assert within_capacity(idx, 4, None, 3).all()


def test_exact_ties_select_the_same_experts_in_both():
    """All-zero logits tie every expert (s = 0.5); torch.topk's order decides, the same in both."""
    plan, cfg = build_plan("custom", "deepseek-tiny", {"layers": 1, "batch": 1}, route_groups=2)
    logits = torch.zeros(cfg.seq, cfg.experts)
    block = MoEBlock(cfg, 0)
    _, idx, _ = block.deepseek_gates(logits)
    hand = route_deepseek(logits, torch.zeros(cfg.experts), cfg, cfg.seq, 1)
    assert torch.equal(idx, hand.idx)
    assert torch.equal(torch.zeros(1, 4).topk(2).indices, torch.tensor([[2, 3]]))   # not lowest-first


MOE_MODELS = {   # name -> (model preset, plan fields, model overrides)
    "gshard top-2 dropless": ("tiny", dict(experts=4), {"layers": 2}),
    "gshard top-1 drops, moe every 2": ("tiny", dict(experts=4, top_k=1, capacity_factor=1.0),
                                        {"layers": 2, "moe_every": 2}),
    "deepseek 4 groups top-2, capacity, bias": (
        "deepseek-tiny", dict(route_groups=4, route_topk_groups=2, capacity_factor=1.0,
                              seq_aux_alpha=0.1, bias_gamma=0.01), {"layers": 2}),
}


@pytest.mark.parametrize("name", MOE_MODELS)
def test_moe_blocks_agree_with_the_hand_reference(name):
    model, fields, over = MOE_MODELS[name]
    plan, cfg = build_plan("custom", model, over, **fields)
    hand, auto = Reference(plan, cfg), TorchReference(plan, cfg)
    for _ in range(3):
        (loss_h, grads_h), (loss_a, grads_a) = hand.forward_backward(), auto.forward_backward()
        assert loss_a == pytest.approx(loss_h, abs=2e-6)
        for n, g in grads_h.items():
            torch.testing.assert_close(grads_a[n], g, atol=2e-7, rtol=1e-5)
        assert set(auto.routing) == set(hand.routing)
        for index, fig in hand.routing.items():
            for key in ("tokens_per_expert", "chosen_per_expert", "dropped"):
                assert auto.routing[index][key] == fig[key]
            assert auto.routing[index]["balance_loss"] == pytest.approx(fig["balance_loss"], abs=1e-7)
            assert auto.routing[index]["bias"] == pytest.approx(fig["bias"]) if fig["bias"] else \
                auto.routing[index]["bias"] is None
        hand.update(grads_h), auto.update(grads_h)
    last = hand.routing
    if fields.get("capacity_factor"):
        assert sum(f["dropped"] for f in last.values()) > 0
    if model == "deepseek-tiny":     # the bias moved (by the reference's own loads) and still agrees
        assert any(b != 0.0 for f in auto.routing.values() for b in f["bias"])


MOE_PLANS = {   # each world run costs seconds on 2 cores: one plan per feature
    "ep 2": ["--ep", 2, "--experts", 4],
    "ep 4": ["--ep", 4, "--world", 4, "--experts", 4],
    "dp 4 x ep 2": ["--dp", 4, "--ep", 2, "--experts", 4],
    "gshard drops": ["--ep", 2, "--experts", 4, "--top-k", 1, "--capacity-factor", 1.0],
    "deepseek groups + bias": ["--model", "deepseek-tiny", "--ep", 2, "--route-groups", 4,
                               "--route-topk-groups", 2, "--seq-aux-alpha", 0.1,
                               "--bias-gamma", 0.01],
    "pp 2 x ep 2 dualpipev, moe every 2": ["--model", "deepseek-tiny", "--pp", 2, "--dp", 2,
                                           "--ep", 2, "--schedule", "dualpipev",
                                           "--microbatches", 4, "--moe-every", 2],
}


@pytest.mark.parametrize("name", MOE_PLANS)
def test_moe_plans_hold_to_the_autograd_reference(name):
    layers = 4 if "--pp" in MOE_PLANS[name] else 2          # DualPipeV: 2 stages a rank
    proc = run_cli("run", *MOE_PLANS[name], "--layers", layers, "--steps", 3, "--check",
                   "--reference", "autograd", "--json", timeout=240)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    steps, summary = proc.lines[:-1], proc.lines[-1]["summary"]
    assert summary["check"] == "passed" and summary["steps"] == 3
    assert all(s["moe_layers"] for s in steps)          # the routing counts were compared
    if name == "gshard drops":
        assert all(s["moe_dropped"] > 0 for s in steps)
    if "bias" in name:
        assert any(b for s in steps for f in s["moe_layers"].values() for b in f["bias"])
