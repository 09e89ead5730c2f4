"""Expert parallel end to end: --check plans, a 2-rank world test of the layer's dispatch modes
(routing oracle and gradients against the single-process layer), and bad input."""
import importlib.util
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from conftest import check_plan, run_cli
from kernels import comm
from planning.config import make_config
from kernels.weights import init_params
from kernels.ep.build import build_moe
from kernels.layers.base import Ctx
from kernels.stats import StepStats
from worlds import run_world

EP2 = ("--experts", 4, "--ep", 2)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("args", [
    EP2 + ("--world", 2, "--top-k", 1, "--capacity-factor", 0.5),
    EP2 + ("--world", 2, "--top-k", 2, "--overlap"),
    EP2 + ("--world", 4, "--top-k", 2, "--capacity-factor", 0.5, "--overlap"),   # dp 4 x ep 2
    ("--experts", 4, "--ep", 4, "--world", 4, "--top-k", 2, "--capacity-factor", 0.5),
    ("--experts", 4, "--ep", 4, "--world", 4, "--top-k", 1, "--overlap"),
    ("--experts", 8, "--ep", 4, "--world", 4, "--top-k", 2, "--capacity-factor", 0.75,
     "--overlap", "--grad-sync", "bucketed"),
], ids=["ep2-top1-drop", "ep2-top2-overlap", "dp4ep2-top2-drop-overlap", "ep4-top2-drop",
        "ep4-top1-overlap", "ep4-8experts-bucketed-overlap"])
def test_expert_parallel_matches_reference(args):
    check_plan(*args, steps=2)


@pytest.mark.timeout(900)
@pytest.mark.skipif(importlib.util.find_spec("kernels.pp.executor") is None,
                    reason="the pipeline executor (kernels/pp/executor.py) is not there yet")
def test_expert_parallel_with_dualpipev():
    check_plan(*EP2, "--pp", 2, "--dp", 2, "--schedule", "dualpipev", "--microbatches", 4,
               "--capacity-factor", 0.75, steps=2)


@pytest.mark.parametrize("args,message", [
    (("--experts", 6, "--ep", 4, "--world", 4), "6 experts not divisible by ep 4"),
    (("--experts", 4, "--top-k", 5), "top-k 5 must be between 1 and the 4 experts"),
    (("--experts", 4, "--capacity-factor", 0), "capacity factor 0.0 must be > 0"),
    (("--experts", 4, "--capacity-factor", -1), "capacity factor -1.0 must be > 0"),
    (("--experts", 6, "--ep", 3, "--world", 4), "ep 3 must divide dp 4"),
])
def test_bad_input_exits_2(args, message):
    proc = run_cli("run", *args, "--steps", 1, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr


# ---------------------------------------------------------------- a 2-rank world, layer level

def _rank_main(rank, world):
    return _layer_checks(rank, world, comm.new_groups("ep", [list(range(world))]))


def _layer_checks(rank, world, group):
    """Errors of this rank's EP layer against the whole batch in one process."""
    errs = {}
    cases = [(e, k, f) for e in (False, True) for k, f in ((1, 0.5), (2, 0.5), (2, None))]
    for early, top_k, cf in cases:
        if early:   # as the overlap runner runs it: counts exchanged early, ops posted by a thread
            comm.post_from_thread(group)
        for mode in ("uneven", "even"):
            cfg = replace(make_config("tiny", batch=4, seq=8), experts=4, top_k=top_k,
                          capacity_factor=cf)
            t = init_params(cfg, 0, torch.float64)
            t["layers.0.moe.router.weight"] = t["layers.0.moe.router.weight"] * 50
            ref = build_moe(cfg, "layers.0.moe.", t, None, stats=StepStats())
            rctx = SimpleNamespace(plan=SimpleNamespace(cp=1), group=lambda name: group,
                                   stats=StepStats())
            ep = build_moe(cfg, "layers.0.moe.", t, rctx, dispatch=mode)
            ep.early_counts = early
            g = torch.Generator().manual_seed(1)
            x = torch.randn(4, 8, cfg.dim, generator=g, dtype=torch.float64)
            dy = torch.randn(4, 8, cfg.dim, generator=g, dtype=torch.float64)
            rows = slice(rank * 4 // world, (rank + 1) * 4 // world)
            y_ref, c_ref = ref.forward(x)
            dx_ref = ref.backward_input(c_ref, dy)
            ref.backward_weight(c_ref)
            y, c = ep.forward(x[rows])
            dx = ep.backward_input(c, dy[rows])
            ep.backward_weight(c)
            comm.all_reduce(ep.router.grad, group)        # dense grad: summed over replicas
            key = f"top{top_k} cf{cf} {mode}{' early' if early else ''}"
            errs[key + " y"] = (y - y_ref[rows]).abs().max().item()
            errs[key + " dx"] = (dx - dx_ref[rows]).abs().max().item()
            errs[key + " router"] = (ep.router.grad - ref.router.grad).abs().max().item()
            for kind in ("w1", "w3", "w2"):
                mine, full = getattr(ep, kind), getattr(ref, kind)
                errs[f"{key} {kind}"] = (mine.grad - full.grad[mine.shard[0]]).abs().max().item() \
                    if mine.shard else (mine.grad - full.grad).abs().max().item()
            # routing oracle across ranks: expert e scales by e + 1 wherever it lives
            def scaled(rws, counts, moe=ep):
                return torch.cat([xc * (moe.lo + l + 1) for l, xc in
                                  enumerate(rws.split(counts))]), Ctx(per=[], counts=counts)
            ep.run_experts = scaled
            y, _ = ep.forward(x[rows])
            r = c_ref.r
            factor = (r.w * r.keep * (r.idx + 1)).sum(-1).view(4, 8)[rows]
            errs[key + " scaled"] = (y - x[rows] * factor[..., None]).abs().max().item()
    return errs


@pytest.mark.timeout(300)
def test_layer_dispatch_modes_on_two_ranks():
    for rank, errs in enumerate(run_world(2, _rank_main, timeout_s=240)):
        bad = {k: v for k, v in errs.items() if v > 1e-10}
        assert not bad, f"rank {rank}: {bad}"
        assert len(errs) == 2 * 3 * 2 * 7


# ---------------------------------------------------------------- the overlap runner's order

@pytest.mark.timeout(300)
def test_overlap_order_hides_counts_and_the_last_combines_under_the_heads(tmp_path):
    """Each uneven count exchange is issued inside its router span (before the rows are built);
    the last block's combine of mb1 is waited after mb0's head, and mb0's combine grads are issued
    before mb1's head runs, so each flies under the other microbatch's head."""
    trace = tmp_path / "t.json"
    run_cli("run", *EP2, "--overlap", "--steps", 1, "--trace", trace, check_rc=0, timeout=240)
    evs = json.loads(trace.read_text())["traceEvents"]
    for rank in (0, 1):
        xs = [e for e in evs if e.get("ph") == "X" and e["pid"] == rank]
        counts = [e["ts"] for e in xs if e.get("cat") == "comm" and e["args"].get("bytes") == 64]
        routers = [e for e in xs if e["name"] == "router + dispatch rows"]
        assert len(routers) == 8 and len(counts) == 8           # 4 blocks x 2 microbatches
        for r in routers:
            assert any(r["ts"] <= t <= r["ts"] + r["dur"] for t in counts), \
                f"rank {rank}: a count exchange was not issued while its rows were being built"
        start = {e["name"]: e["ts"] for e in xs}
        assert start["head mb0"] < start["combine L3 mb1"] < start["head mb1"]
        assert start["combine dX L3 mb0"] < start["head mb1"] < start["combine dX L3 mb1"]
