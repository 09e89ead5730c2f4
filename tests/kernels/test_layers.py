"""Every hand-written layer and the whole model against torch.autograd, in float64."""
import torch
from torch.testing import assert_close

from kernels.layers import (Attention, CrossEntropy, Embedding, Linear, LocalAttention, Param,
                            RMSNorm, SwiGLU, apply_rope, apply_rope_backward, rope_tables)
from planning.config import make_config
from kernels.model import build_model, reference_step

D = torch.float64


def _check_layer(layer, x, params, fwd=None):
    """Compare dX and every dW of `layer` with autograd for a random upstream gradient."""
    fwd = fwd or layer.forward
    y, ctx = fwd(x)
    dy = torch.randn_like(y)
    dx = layer.backward_input(ctx, dy)
    layer.backward_weight(ctx)
    # autograd on the same forward
    xa = x.detach().clone().requires_grad_(x.is_floating_point())
    leaves = {}
    for prm in params:
        leaves[prm.name] = prm.data
        prm.data = prm.data.detach().clone().requires_grad_(True)
    ya, _ = fwd(xa)
    inputs = [prm.data for prm in params] + ([xa] if xa.requires_grad else [])
    grads = torch.autograd.grad((ya * dy).sum(), inputs)
    for prm, g in zip(params, grads):
        assert_close(prm.grad, g, msg=f"dW of {prm.name}")
        prm.data = leaves[prm.name]
    if xa.requires_grad:
        assert_close(dx, grads[-1], msg="dX")


def _p(name, *shape):
    return Param(name, torch.randn(*shape, dtype=D) * 0.5)


def test_linear():
    w = _p("w", 5, 7)
    _check_layer(Linear(w), torch.randn(2, 3, 7, dtype=D), [w])


def test_linear_accumulates_over_microbatches():
    w = _p("w", 4, 3)
    lin = Linear(w)
    for _ in range(2):
        y, c = lin.forward(torch.randn(6, 3, dtype=D))
        lin.backward_input(c, torch.ones_like(y))
        lin.backward_weight(c)
    assert w.grad_count == 2


def test_embedding_and_vocab_shard():
    w = _p("w", 11, 4)
    ids = torch.randint(0, 11, (2, 5))
    _check_layer(Embedding(w), ids, [w])
    part = _p("part", 5, 4)   # rows 6..10 of the vocabulary; ids outside give zero rows
    y, _ = Embedding(part, vocab_start=6).forward(ids)
    assert (y[ids < 6] == 0).all()
    _check_layer(Embedding(part, vocab_start=6), ids, [part])


def test_rmsnorm():
    w = Param("w", 1 + torch.randn(8, dtype=D) * 0.1)
    _check_layer(RMSNorm(w), torch.randn(3, 4, 8, dtype=D), [w])


def test_rope_backward_is_transpose():
    cos, sin = rope_tables(torch.arange(6), 8, dtype=D)
    x = torch.randn(2, 3, 6, 8, dtype=D, requires_grad=True)
    dy = torch.randn(2, 3, 6, 8, dtype=D)
    (g,) = torch.autograd.grad((apply_rope(x, cos, sin) * dy).sum(), x)
    assert_close(apply_rope_backward(dy, cos, sin), g)


def _attention(heads, kv, seq=6, dim=16):
    hd = dim // heads
    ws = [_p("wq", heads * hd, dim), _p("wk", kv * hd, dim), _p("wv", kv * hd, dim),
          _p("wo", dim, heads * hd)]
    pos = torch.arange(seq)
    cos, sin = rope_tables(pos, hd, dtype=D)
    layer = Attention(*map(Linear, ws), heads, kv, hd, cos, sin, LocalAttention(pos))
    return layer, ws


def test_attention_gqa():
    layer, ws = _attention(heads=4, kv=2)
    _check_layer(layer, torch.randn(2, 6, 16, dtype=D), ws)


def test_attention_mha_and_mqa():
    for heads, kv in ((4, 4), (4, 1)):
        layer, ws = _attention(heads, kv)
        _check_layer(layer, torch.randn(1, 6, 16, dtype=D), ws)


def test_attention_is_causal():
    layer, _ = _attention(4, 2)
    x = torch.randn(1, 6, 16, dtype=D)
    y1, _ = layer.forward(x)
    x2 = x.clone()
    x2[:, 4:] += 1.0  # changing the future must not change the past
    y2, _ = layer.forward(x2)
    assert_close(y1[:, :4], y2[:, :4])
    assert not torch.allclose(y1[:, 4:], y2[:, 4:])


def test_swiglu():
    ws = [_p("w1", 12, 8), _p("w3", 12, 8), _p("w2", 8, 12)]
    _check_layer(SwiGLU(*map(Linear, ws)), torch.randn(2, 3, 8, dtype=D), ws)


def test_cross_entropy():
    logits = torch.randn(10, 7, dtype=D, requires_grad=True)
    t = torch.randint(0, 7, (10,))
    ce = CrossEntropy()
    loss, ctx = ce.forward(logits.detach(), t, denom=10)
    assert_close(loss, torch.nn.functional.cross_entropy(logits, t))
    (g,) = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, t), logits)
    assert_close(ce.backward_input(ctx), g)


def test_cross_entropy_large_logits_are_stable():
    logits = torch.tensor([[1000.0, 0.0], [0.0, -1000.0]], dtype=D)
    loss, _ = CrossEntropy().forward(logits, torch.tensor([0, 1]), denom=2)
    assert torch.isfinite(loss) and abs(loss.item() - 500.0) < 1e-9


def test_whole_model_hand_equals_autograd():
    cfg = make_config("tiny", layers=2, seq=8, batch=2)
    ids = torch.randint(0, cfg.vocab, (2, 9))
    hand, auto = build_model(cfg, seed=3, dtype=D), build_model(cfg, seed=3, dtype=D)
    l1 = reference_step(hand, ids[:, :-1], ids[:, 1:], backward="hand")
    l2 = reference_step(auto, ids[:, :-1], ids[:, 1:], backward="autograd")
    assert_close(l1, l2)
    pa = auto.params()
    for name, prm in hand.params().items():
        assert_close(prm.grad, pa[name].grad, msg=name)


def test_microbatches_sum_to_full_batch():
    cfg = make_config("tiny", layers=1, seq=8, batch=4)
    ids = torch.randint(0, cfg.vocab, (4, 9))
    a, b = build_model(cfg, 1, D), build_model(cfg, 1, D)
    assert_close(reference_step(a, ids[:, :-1], ids[:, 1:], 1),
                 reference_step(b, ids[:, :-1], ids[:, 1:], 4))
    pb = b.params()
    for name, prm in a.params().items():
        assert_close(prm.grad, pb[name].grad, msg=name)
