"""MoE memory, measured against predicted (issue 33 item 6): every runner keeps the memory account,
the EP overlap runner included, and `partui plan`'s formula (planning/moe_memory.py) equals what the
account measures. An even dispatch is exact to the byte; an uneven one is exact once the rows each
rank's experts received (the step's routing figures) replace the balanced count, each row worth the
bytes listed here from the experts' own weight shapes."""
import pytest
import torch

from worlds import run_world
from planning.config import make_config, param_shapes
from kernels.engine import Engine
from kernels.memory_plan import predict_rank
from planning.mesh import Plan
from planning.moe_memory import moe_mlp_bytes

MOE = dict(dp=2, ep=2, experts=4)


def _rank(rank, size, fields, model):
    torch.set_num_threads(1)
    eng = Engine(Plan(**fields), make_config(model), rank)
    res = eng.step()
    return {**res.extra["memory"], "predicted": predict_rank(eng),
            "moe_layers": res.extra.get("moe_layers", {})}


def _world(fields, model="small"):
    return run_world(2, _rank, fields, model, timeout_s=150)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("fields, model", [
    (dict(MOE, ep_dispatch="even"), "small"),
    (dict(MOE, ep_dispatch="even", overlap=True), "small"),            # the overlap runner: a pair
    (dict(MOE, ep_dispatch="even", overlap=True, microbatches=2), "deepseek-tiny"),
    (dict(MOE, ep_dispatch="even", capacity_factor=1.0, top_k=1), "small"),   # capacity-padded
])
def test_an_even_dispatch_measures_what_the_plan_predicts(fields, model):
    for m in _world(fields, model):
        measured, predicted = m["kind_peaks"]["activations"], m["predicted"]["activations"]
        assert measured > 0
        assert measured == predicted, (fields, measured, predicted)
        assert m["peak_activation_entries"] == m["predicted"]["activation_microbatches"] \
            == (2 if fields.get("overlap") else 1)
        assert not m["predicted"]["balanced_routing"]


def received_row_bytes(cfg) -> int:
    """What one row an expert receives keeps (fp32): its place in the arrival order and back
    (two int64), the row itself [dim], and SwiGLU's h1, h3, sig, act and w2's input [hidden]."""
    hidden, dim = param_shapes(cfg)["layers.0.moe.experts.w1.weight"][1:]
    return 2 * 8 + 4 * (dim + 5 * hidden)


@pytest.mark.timeout(300)
def test_the_overlap_runner_holds_both_microbatches_and_follows_the_routing():
    """`partui run --ep 2 --experts 4 --overlap`: it held nothing before (the runner never touched
    the account); now both halves' contexts, equal to the prediction moved by the rows the routing
    actually sent each rank's experts."""
    cfg = make_config("small", experts=4)
    got = _world(dict(MOE, overlap=True))
    for rank, m in enumerate(got):
        pred = m["predicted"]
        assert pred["balanced_routing"] and pred["activation_microbatches"] == 2
        assert m["peak_activation_entries"] == 2
        received = sum(layer["tokens_per_ep_rank"][rank] for layer in m["moe_layers"].values())
        balanced = cfg.layers * cfg.batch // 2 * cfg.seq * cfg.top_k    # a rank's tokens x top-k
        assert m["kind_peaks"]["activations"] == \
            pred["activations"] + (received - balanced) * received_row_bytes(cfg)
    # the two ranks' received rows add up to the balanced count: one's surplus is the other's lack
    assert sum(m["kind_peaks"]["activations"] for m in got) == 2 * got[0]["predicted"]["activations"]


def test_the_moe_formula_lists_each_saved_tensor():
    """One GShard layer, by hand: T = 6 tokens, E = 4, K = 2, dim 8, hidden 16, fp32, even
    dispatch with no capacity (every expert a whole group's slots: N = M = E x T = 24)."""
    cfg = make_config("tiny", experts=4, dim=8, heads=2, kv_heads=2, seq=6, batch=2, moe_hidden=16)
    plan = Plan(dp=2, ep=2, experts=4, ep_dispatch="even")
    t, e, k, n, d, h = 6, 4, 2, 24, 8, 16
    routing = 4 * (t * e + t * e + t * k + t * k + 1) + 8 * (t * k + t * k) + t * k
    rows = 8 * n + 8 * n + 4 * n + 8 * e             # src, arow, valid; counts
    experts = 8 * n + 8 * n + 4 * n * d + 4 * 5 * n * h
    returned = 4 * n * d
    assert moe_mlp_bytes(cfg, plan, t, 4) == routing + rows + experts + returned


def _pipeline_rank(rank, size, fields):
    torch.set_num_threads(1)
    eng = Engine(Plan(**fields), make_config("small"), rank)
    return {**eng.step().extra["memory"], "predicted": predict_rank(eng)}


@pytest.mark.timeout(400)
@pytest.mark.parametrize("fields", [
    dict(dp=2, pp=2, schedule="1f1b", microbatches=4),          # a dp slice keeps only its rows
    dict(MOE, pp=2, schedule="1f1b", microbatches=4, ep_dispatch="even", fb_overlap=True),
])
def test_pipelines_with_dp_and_fb_pairs_measure_what_the_plan_predicts(fields):
    """1F1B's F&B pairs run a forward further ahead and hold it while the pair's backward runs:
    twice 1F1B's in-flight count, walked from the paired schedule (planning/pipeline/actions.py
    held_contexts), and the account holds exactly that."""
    got = run_world(4, _pipeline_rank, fields, timeout_s=200)
    for m in got:
        assert m["kind_peaks"]["activations"] == m["predicted"]["activations"], fields
        assert m["peak_activation_entries"] == m["predicted"]["activation_microbatches"]
    if fields.get("fb_overlap"):
        assert [m["peak_activation_entries"] for m in got] == [4, 4, 2, 2]   # 2 x (P - r), dp 2
