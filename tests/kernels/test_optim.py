import torch
from torch.testing import assert_close

from kernels.layers import Param
from kernels.optim import SGD, AdamW, make_optimizer
import pytest


def test_adamw_equals_torch():
    torch.manual_seed(0)
    w0 = torch.randn(50, 7)
    mine = Param("w", w0.clone())
    ref = torch.nn.Parameter(w0.clone())
    opt = AdamW(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    topt = torch.optim.AdamW([ref], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step in range(20):
        g = torch.randn(50, 7) * (step + 1)
        mine.grad, ref.grad = g.clone(), g.clone()
        opt.step([mine])
        topt.step()
        assert_close(mine.data, ref.data, atol=1e-6, rtol=0)
    assert_close(opt.state["w"]["m"], topt.state[ref]["exp_avg"], atol=1e-6, rtol=0)
    assert_close(opt.state["w"]["v"], topt.state[ref]["exp_avg_sq"], atol=1e-6, rtol=0)


def test_adamw_state_is_updated_in_place():
    prm = Param("w", torch.zeros(3))
    prm.grad = torch.ones(3)
    opt = AdamW()
    opt.step([prm])
    m = opt.state["w"]["m"]
    opt.step([prm])
    assert opt.state["w"]["m"] is m and opt.step_count == 2


def test_sgd_equals_torch():
    w0 = torch.randn(4, 4)
    mine, ref = Param("w", w0.clone()), torch.nn.Parameter(w0.clone())
    opt, topt = SGD(lr=0.3, weight_decay=0.0), torch.optim.SGD([ref], lr=0.3)
    for _ in range(3):
        g = torch.randn(4, 4)
        mine.grad, ref.grad = g.clone(), g.clone()
        opt.step([mine])
        topt.step()
    assert_close(mine.data, ref.data)


def test_unknown_optimizer():
    with pytest.raises(ValueError, match="adamw or sgd"):
        make_optimizer("lion")
