"""Selective recompute (kernels/recompute.py): a block keeps its matmul outputs, drops what its
norms, softmax and SwiGLU activation made, and rebuilds them bit for bit before its backward; the
share of the forward it runs again. Its bytes: tests/kernels/test_memory.py."""
import pytest
import torch

from planning.config import make_config, param_shapes
from kernels.block import Block
from kernels.model import build_model, forward_backward
from kernels.recompute import forward_share, recomputed


def _grads(mode: str) -> dict:
    cfg = make_config("tiny")
    model = build_model(cfg, seed=3)
    for layer in model.layers:
        if isinstance(layer, Block):
            layer.recompute = mode
    ids = torch.randint(0, cfg.vocab, (2, cfg.seq), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(ids, -1, 1)
    loss = forward_backward(model.layers, ids, targets, ids.numel())
    return {"loss": loss, **{n: p.grad.clone() for n, p in model.params().items()}}


def test_selective_grads_equal_the_plain_ones_bit_for_bit():
    plain, selective = _grads("none"), _grads("selective")
    assert plain.keys() == selective.keys()
    for name in plain:
        assert torch.equal(plain[name], selective[name]), name


def _block_and_input():
    cfg = make_config("tiny")
    block = build_model(cfg, seed=5).layers[1]
    x = torch.randn(2, cfg.seq, cfg.dim, generator=torch.Generator().manual_seed(2))
    return cfg, block, x


def test_a_slimmed_block_drops_the_named_tensors_and_rebuilds_them_exactly():
    cfg, block, x = _block_and_input()
    _, full = block.forward(x)                              # recompute "none"
    block.recompute = "selective"
    _, slim = block.forward(x)
    dropped = {"attn_norm xhat": slim.c_n1.xhat, "attn_norm rstd": slim.c_n1.rstd,
               "q/k/v input": slim.c_a.cq.x, "probabilities": slim.c_a.ccore.p,
               "mlp_norm xhat": slim.c_n2.xhat, "w1/w3 input": slim.c_m.c1.x,
               "sig": slim.c_m.sig, "act": slim.c_m.act, "w2 input": slim.c_m.c2.x}
    assert all(t is None for t in dropped.values()), dropped
    assert torch.equal(slim.x, x) and slim.c_m.h1 is not None and slim.c_a.ccore.q is not None
    rebuilt = recomputed(block, slim)
    pairs = [(full.c_n1.xhat, rebuilt.c_n1.xhat), (full.c_n1.rstd, rebuilt.c_n1.rstd),
             (full.c_n2.xhat, rebuilt.c_n2.xhat), (full.c_n2.rstd, rebuilt.c_n2.rstd),
             (full.c_a.cq.x, rebuilt.c_a.cq.x), (full.c_a.cv.x, rebuilt.c_a.cv.x),
             (full.c_a.ccore.p, rebuilt.c_a.ccore.p), (full.c_m.c1.x, rebuilt.c_m.c3.x),
             (full.c_m.sig, rebuilt.c_m.sig), (full.c_m.act, rebuilt.c_m.act),
             (full.c_m.c2.x, rebuilt.c_m.c2.x)]
    assert all(torch.equal(a, b) for a, b in pairs)
    assert recomputed(block, rebuilt) is rebuilt            # once: the W finds it rebuilt


def test_forward_share_counts_the_recomputed_operations():
    cfg = make_config("tiny")
    s, d, hd, h, kv = cfg.seq, cfg.dim, cfg.head_dim, cfg.heads, cfg.kv_heads
    f = param_shapes(cfg)["layers.0.mlp.w1.weight"][0]
    matmuls = 2 * s * d * (h + 2 * kv) * hd + 2 * 2 * h * s * s * hd + 2 * s * h * hd * d \
        + 3 * 2 * s * d * f
    elementwise = 2 * (s + 2 * s * d) + s * (h + kv) * hd + h * s * s + 2 * s * d + 3 * s * f
    redo = 2 * (s + 2 * s * d) + 2 * h * s * s * hd + h * s * s + 3 * s * f
    assert forward_share("selective", cfg, s) == pytest.approx(redo / (matmuls + elementwise))
    assert forward_share("full", cfg, s) == 1.0 and forward_share("none", cfg, s) == 0.0
