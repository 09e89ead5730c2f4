"""Tensor parallel: f / g regions, sequence-parallel regions, vocab-parallel embedding and loss
and whole tp models against the dense layers in float64 (2-rank gloo worlds), then end to end
with --check, and the bad inputs."""
from types import SimpleNamespace

import pytest
import torch

from conftest import check_plan, run_cli
from kernels import comm
from planning.config import make_config
from kernels.weights import init_params
from kernels.context import RankContext, build_groups
from kernels.data import global_batch
from kernels.dp.sync import GradSync, piece_index
from kernels.layers import CrossEntropy, Embedding, Linear, Param
from planning.mesh import Plan, coords
from planning.validate import validate
from kernels.model import build_model, forward_backward, named_params, reference_step
from kernels.tp.layers import build_tp_layers
from kernels.tp.loss import VocabParallelCrossEntropy
from kernels.tp.regions import CopyToTP, GatherSeqToTP, ReduceFromTP, ScatterSeqFromTP
from partui.bench.tp import main as bench_tp_main
from partui.bench.tp import torch_llama
from worlds import run_world

WORLD_TIMEOUT_S = 180
D = torch.float64


# ---------------------------------------------------------------- cases run inside each rank

def _err(a, b) -> float:
    return (a - b).abs().max().item()


def case_regions(rank, world, group):
    """f, g and the sp gather / scatter against what they must equal, with per-rank inputs."""
    gen = torch.Generator().manual_seed(3)
    per_rank = [torch.randn(2, 4 * world, 6, generator=gen, dtype=D) for _ in range(world)]
    total = sum(per_rank)
    mine = per_rank[rank]
    s = mine.shape[1] // world
    errs = {}
    f, g = CopyToTP(group), ReduceFromTP(group)
    y, c = f.forward(mine.clone())
    errs["f forward is identity"] = _err(y, mine)
    errs["f backward all-reduces"] = _err(f.backward(c, mine.clone()), total)
    pend = f.start_backward(c, mine.clone())
    errs["f async backward all-reduces"] = _err(pend.wait(), total)
    y, c = g.forward(mine.clone())
    errs["g forward all-reduces"] = _err(y, total)
    errs["g backward is identity"] = _err(g.backward(c, mine), mine)
    gather, scatter = GatherSeqToTP(group), ScatterSeqFromTP(group)
    full_seq = torch.cat([t[:, :s] for t in per_rank], dim=1)        # rank i's slice at i*s
    y, c = gather.forward(mine[:, :s].clone())
    errs["sp gather forward"] = _err(y, full_seq)
    errs["sp gather backward reduce-scatters"] = _err(gather.backward(c, mine.clone()),
                                                      total[:, rank * s:(rank + 1) * s])
    y, c = scatter.forward(mine.clone())
    errs["sp scatter forward"] = _err(y, total[:, rank * s:(rank + 1) * s])
    errs["sp scatter backward gathers"] = _err(scatter.backward(c, mine[:, :s].clone()), full_seq)
    return errs


def case_column_row_pair(rank, world, group):
    """f -> column linear -> row linear -> g equals the dense pair, forward, dX and dW."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 8, generator=gen, dtype=D)
    w1, w2 = torch.randn(12, 8, generator=gen, dtype=D), torch.randn(8, 12, generator=gen, dtype=D)
    dy = torch.randn(2, 3, 8, generator=gen, dtype=D)
    dense1, dense2 = Linear(Param("w1", w1.clone())), Linear(Param("w2", w2.clone()))
    h, c1 = dense1.forward(x)
    y_ref, c2 = dense2.forward(h)
    dx_ref = dense1.backward_input(c1, dense2.backward_input(c2, dy))
    dense1.backward_weight(c1)
    dense2.backward_weight(c2)
    k = 12 // world
    rows, cols = slice(rank * k, (rank + 1) * k), slice(rank * k, (rank + 1) * k)
    col, row = Linear(Param("w1", w1[rows].clone())), Linear(Param("w2", w2[:, cols].clone()))
    f, g = CopyToTP(group), ReduceFromTP(group)
    e, cf = f.forward(x)
    h, cc = col.forward(e)
    p, cr = row.forward(h)
    y, cg = g.forward(p)
    dx = f.backward(cf, col.backward_input(cc, row.backward_input(cr, g.backward(cg, dy))))
    col.backward_weight(cc)
    row.backward_weight(cr)
    return {"pair forward": _err(y, y_ref), "pair dX": _err(dx, dx_ref),
            "column dW rows": _err(col.weight.grad, dense1.weight.grad[rows]),
            "row dW columns": _err(row.weight.grad, dense2.weight.grad[:, cols])}


def case_vocab_parallel(rank, world, group):
    """Vocab-parallel cross-entropy and embedding against the dense ones; huge logits too."""
    gen = torch.Generator().manual_seed(7)
    n, vocab = 10, 8 * world
    v = vocab // world
    errs = {}
    for label, scale in (("", 1.0), (" at logits ~1e4", 1e4)):
        logits = torch.randn(n, vocab, generator=gen, dtype=D) * scale
        targets = torch.randint(0, vocab, (n,), generator=gen)
        loss_ref, c = CrossEntropy().forward(logits, targets, 40)
        dl_ref = CrossEntropy().backward_input(c, 0.5)
        ce = VocabParallelCrossEntropy(group, rank * v, (rank + 1) * v)
        loss, c = ce.forward(logits[:, rank * v:(rank + 1) * v].clone(), targets, 40)
        dl = ce.backward_input(c, 0.5)
        rel = max(1.0, abs(loss_ref.item()))
        errs["ce loss" + label] = abs(loss.item() - loss_ref.item()) / rel
        errs["ce dlogits slice" + label] = _err(dl, dl_ref[:, rank * v:(rank + 1) * v])
        errs["ce finite" + label] = 0.0 if bool(torch.isfinite(loss)) else float("inf")
    table = torch.randn(vocab, 5, generator=gen, dtype=D)
    ids = torch.randint(0, vocab, (2, 6), generator=gen)
    dy = torch.randn(2, 6, 5, generator=gen, dtype=D)
    dense = Embedding(Param("e", table.clone()))
    y_ref, c = dense.forward(ids)
    dense.backward_input(c, dy)
    dense.backward_weight(c)
    emb, g = Embedding(Param("e", table[rank * v:(rank + 1) * v].clone()), rank * v), \
        ReduceFromTP(group)
    y, ce_ = emb.forward(ids)
    y, cg = g.forward(y)
    emb.backward_input(ce_, g.backward(cg, dy))
    emb.backward_weight(ce_)
    errs["embedding forward"] = _err(y, y_ref)
    errs["embedding dW rows"] = _err(emb.weight.grad, dense.weight.grad[rank * v:(rank + 1) * v])
    return errs


def case_whole_model(rank, world, group):
    """build_tp_layers against build_model in float64: loss and every grad piece, with and
    without sp, kv heads sharded and replicated, dW overlapped with dX comm or not, and under
    torch autograd (the regions are autograd functions, so the oracle sees the comm)."""
    errs = {}
    groups = None
    for kv in (2, 1):
        cfg = make_config("tiny", vocab=64, dim=32, layers=2, heads=4, kv_heads=kv, seq=8, batch=2)
        tensors = init_params(cfg, 1, D)
        dense = build_model(cfg, 1, D, {k: t.clone() for k, t in tensors.items()})
        ids = torch.randint(0, cfg.vocab, (2, cfg.seq), generator=torch.Generator().manual_seed(2))
        targets = ids.roll(-1, 1)
        loss_ref = forward_backward(dense.layers, ids, targets, ids.numel())
        ref = dense.params()
        for sp in (False, True):
            for overlap in (True, False, "autograd"):
                plan = validate(Plan(tp=world, sp=sp), cfg, world)
                groups = groups or build_groups(plan)    # the same tp / dp ... partitions
                ctx = RankContext(plan, cfg, rank, coords(plan, rank), dict(groups))
                layers = build_tp_layers(cfg, {k: t.clone() for k, t in tensors.items()}, ctx)
                for layer in layers:
                    if hasattr(layer, "overlap_weight_grad"):
                        layer.overlap_weight_grad = overlap is True
                loss = forward_backward(layers, ids, targets, ids.numel(),
                                        "autograd" if overlap == "autograd" else "hand")
                params = named_params(layers)
                GradSync(ctx, params, None).reduce_model_parallel()
                label = f"kv {kv}{' sp' if sp else ''} {overlap}"
                errs[f"{label} loss"] = abs(loss.item() - loss_ref.item())
                assert set(params) == set(ref), sorted(set(ref) ^ set(params))
                worst = 0.0
                for name, q in params.items():
                    idx = piece_index(q)
                    want = ref[name].grad if idx is None else \
                        ref[name].grad[tuple(slice(a, b) for a, b in idx)]
                    worst = max(worst, _err(q.grad, want))
                errs[f"{label} grads"] = worst
                comm.barrier(group)
    return errs


CASES = {"regions": case_regions, "pair": case_column_row_pair, "vocab": case_vocab_parallel,
         "model": case_whole_model}


def _case_errors(rank, world, case):
    group = comm.new_groups("tp", [list(range(world))])
    return CASES[case](rank, world, group)


def _run_world(world, case):
    errs = run_world(world, _case_errors, case, timeout_s=WORLD_TIMEOUT_S,
                     what=f"tp world of {world} ({case})")
    return dict(enumerate(errs))


@pytest.mark.timeout(WORLD_TIMEOUT_S + 60)
@pytest.mark.parametrize("case", ["regions", "pair", "vocab", "model"])
def test_tp_pieces_match_dense_float64(case):
    out = _run_world(2, case)
    assert sorted(out) == [0, 1]
    for rank, errs in out.items():
        assert errs, f"{case}: rank {rank} compared nothing"
        for what, err in errs.items():
            assert err < 1e-10, f"{case} rank {rank}: {what} off by {err:.2e}"


# ---------------------------------------------------------------- end to end (--check)

SMALL = ("--layers", "2", "--seq", "16", "--batch", "4")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("args,world", [
    (("--tp", 2), 2),                      # kv heads sharded (2 kv heads, 1 per rank)
    (("--tp", 2, "--sp"), 2),
    (("--tp", 4), 4),                      # kv heads replicated (each on 2 ranks)
    (("--tp", 4, "--sp"), 4),
    (("--dp", 2, "--tp", 2), 4),
    (("--tp", 2, "--experts", 4), 2),      # MoE layers run whole on every tp rank
], ids=lambda a: " ".join(map(str, a)) if isinstance(a, tuple) else str(a))
def test_check_plan_tp(args, world):
    summary = check_plan(*args, *SMALL, steps=2)
    assert summary["world"] == world
    assert summary["max_abs_grad_err"] <= 2e-5


@pytest.mark.timeout(600)
def test_check_plan_dp2_tp2_zero1():
    check_plan("--dp", 2, "--tp", 2, "--zero", 1, *SMALL, steps=2)


def test_snapshot_pieces_name_rows_and_columns():
    """Column-parallel params hold rows, row-parallel ones columns, replicated kv heads repeat."""
    cfg = make_config("tiny")                                 # 4 heads, 2 kv heads, hd 16
    plan = validate(Plan(tp=4), cfg, 4)
    rank = 3
    ctx = SimpleNamespace(plan=plan, coords={"tp": rank},
                          groups={"tp": SimpleNamespace(size=4, rank=rank), "tp_kv": object()})
    layers = build_tp_layers(cfg, init_params(cfg, 0), ctx)
    params = named_params(layers)
    assert piece_index(params["layers.0.attn.wq.weight"]) == [[48, 64], [0, 64]]
    assert piece_index(params["layers.0.attn.wo.weight"]) == [[0, 64], [48, 64]]
    assert piece_index(params["layers.0.attn.wk.weight"]) == [[16, 32], [0, 64]]  # kv head 1
    assert params["layers.0.attn.wk.weight"].replicated_over == ["tp_kv"]
    assert piece_index(params["layers.0.mlp.w2.weight"]) == [[0, 64], [132, 176]]
    assert piece_index(params["embed.weight"]) == [[192, 256], [0, 64]]
    assert piece_index(params["layers.1.mlp_norm.weight"]) is None


# ---------------------------------------------------------------- bad input

@pytest.mark.timeout(120)
@pytest.mark.parametrize("args,words", [
    (("--tp", 3), ["tp 3", "4 heads"]),
    (("--tp", 2, "--sp", "--seq", 31), ["seq 31", "tp 2"]),
    (("--tp", 2, "--vocab", 255), ["vocab 255", "tp 2"]),
])
def test_bad_tp_input_exits_2(args, words):
    proc = run_cli("run", *args, "--steps", 1, timeout=100)
    assert proc.returncode == 2, proc.stderr
    for w in words:
        assert w in proc.stderr, (w, proc.stderr)


# ---------------------------------------------------------------- the benchmark's torch peer

def test_bench_peer_model_is_the_same_llama():
    """The nn.Module that DTensor parallelizes gives partui's loss and grads on one process."""
    cfg = make_config("tiny", layers=2)
    ids, targets = global_batch(cfg.batch, cfg.seq, cfg.vocab, 0, 0)
    ours = build_model(cfg, 0)
    loss_ref = float(reference_step(ours, ids, targets))
    peer = torch_llama(cfg, init_params(cfg, 0))
    loss = peer(ids, targets)
    loss.backward()
    assert abs(loss.item() - loss_ref) < 1e-5
    grads = dict(peer.named_parameters())
    for name, prm in ours.params().items():
        assert (grads[name].grad - prm.grad).abs().max().item() < 2e-5, name


def test_bench_rejects_bad_tp():
    assert bench_tp_main(["--tp", "1"]) == 2
    assert bench_tp_main(["--tp", "3"]) == 2          # 4 heads
