"""The overlapped F&B pair (fb_overlap): DeepSeek's parts of a layer, the pair's order as data, 1F1B's
combined pairs, the pair's grads against autograd (float64), `--check` for the Done-when plans, bad input,
and on a recorded trace that each all-to-all of one side flies under the other microbatch's compute."""
import json
from dataclasses import replace

import pytest
import torch

from conftest import check_plan, run_cli
from planning.config import make_config
from kernels.model import LayerHooks, build_model, forward_backward
from planning.pipeline.fb_order import BACKWARD_PARTS, FORWARD_PARTS, ISSUES, pair_order
from planning.pipeline.part_costs import PartCost, cost_from_parts, pair_timeline, run_parts
from kernels.pp.parts import BackwardParts, ForwardParts, chunk_pair_order, layer_kind, run_pair
from planning.pipeline.catalog import build_schedule
from planning.pipeline.schedules import check_schedule
from planning.pipeline.simulate import simulate
from kernels.pp.stages import Chunk, drive, forward_steps

pytestmark = pytest.mark.timeout(600)


# ---------------------------------------------------------------- the order as data

def test_two_moe_layers_take_deepseeks_order():
    """Unit costs (ATTN = MLP = A2A = 1, COMBINE 0): the backward's COMBINE (0 long) issues COMBINE(B) first,
    then each part runs under the transfer the other side issued just before it, layer after layer, and the
    weight grads close the pair under the backward's pipeline send."""
    got = [(p.side, p.layer, p.part) for p in pair_order(["moe", "moe"], ["moe", "moe"])]
    want = [("B", 0, "COMBINE"), ("F", 0, "ATTN"), ("B", 0, "MLP"), ("F", 0, "MLP"), ("B", 0, "ATTN"),
            ("B", 1, "COMBINE"), ("F", 0, "COMBINE"), ("F", 1, "ATTN"), ("B", 1, "MLP"), ("F", 1, "MLP"),
            ("B", 1, "ATTN"), ("F", 1, "COMBINE"), ("B", 0, "MLP_W"), ("B", 0, "ATTN_W"), ("B", 1, "MLP_W"),
            ("B", 1, "ATTN_W")]
    assert got == want
    hides = {(p.side, p.layer, p.part): p.hides for p in pair_order(["moe", "moe"], ["moe", "moe"])}
    assert hides[("F", 0, "ATTN")] == "COMBINE(B) L1"           # backward positions name model layers: L1
    assert hides[("B", 0, "MLP")] == "DISPATCH(F) L0"
    assert hides[("F", 0, "MLP")] == "DISPATCH(B) L1"
    assert hides[("B", 0, "ATTN")] == "COMBINE(F) L0"


KINDS = [["moe"], ["dense"], ["embed", "moe"], ["dense", "moe"], ["moe", "dense", "head"],
         ["embed", "dense", "moe", "dense", "moe"], ["moe", "moe", "head"]]


@pytest.mark.parametrize("fk", KINDS, ids="-".join)
@pytest.mark.parametrize("bk", KINDS, ids="-".join)
def test_every_part_once_weights_after_inputs_and_issues_covered(fk, bk):
    order = pair_order(fk, bk)
    want = sorted([("F", k, p) for k, kind in enumerate(fk) for p in FORWARD_PARTS[kind]]
                  + [("B", k, p) for k, kind in enumerate(reversed(bk)) for p in BACKWARD_PARTS[kind]])
    assert sorted((p.side, p.layer, p.part) for p in order) == want
    for side in "FB":                                    # each side keeps its own order of input parts
        seq = [(p.layer, p.part) for p in order if p.side == side and not p.weight]
        table = FORWARD_PARTS if side == "F" else BACKWARD_PARTS
        kinds = fk if side == "F" else list(reversed(bk))
        assert seq == [(k, p) for k, kind in enumerate(kinds) for p in table[kind] if not p.endswith("_W")]
    pos = {(p.side, p.layer, p.part): i for i, p in enumerate(order)}
    for (side, k, part), i in pos.items():
        if part.endswith("_W"):
            assert pos[(side, k, part[:-2])] < i
    # between an all-to-all's issue and the part that waits for it, a part of the other microbatch runs
    # (the backward's weight grads are the backward microbatch's) while that side has an input part left
    for i, p in enumerate(order):
        kinds = fk if p.side == "F" else list(reversed(bk))
        if kinds[p.layer] == "moe" and (p.side, p.part) in ISSUES:
            j = next(j for j, q in enumerate(order) if q.side == p.side and q.layer == p.layer
                     and q.waits == ISSUES[(p.side, p.part)] and j > i)
            if any(q.side != p.side and not q.weight for q in order[i + 1:]):
                assert any(q.side != p.side for q in order[i + 1:j]), (i, order)


def test_one_f_one_b_pairs_validate_and_keep_1f1b_bubble():
    for pp, m in [(2, 2), (2, 4), (3, 6), (4, 8), (4, 16)]:
        plain, paired = build_schedule("1f1b", pp, m), build_schedule("1f1b", pp, m, fb_overlap=True)
        check_schedule(paired)
        assert sum(a.kind == "FB" for acts in paired.actions for a in acts) == sum(
            max(0, m - min(m, 2 * (pp - 1 - r) + 1)) for r in range(pp))
        assert simulate(paired).bubble == simulate(plain).bubble      # pairs cost F+B: 1F1B's (P-1)(F+B)
    with pytest.raises(ValueError, match="fb_overlap runs the overlapped F&B pairs"):
        build_schedule("zb1p", 2, 4, fb_overlap=True)


# ---------------------------------------------------------------- the pair's math, float64

def test_pair_by_parts_equals_autograd():
    """Forward of mb 1 and backward of mb 0 through [embed, dense, moe, dense, moe, head], interleaved by
    pair_order: loss and every grad equal autograd's over both microbatches."""
    cfg = replace(make_config("tiny", batch=4, seq=8), experts=4, top_k=2, moe_every=2)
    ids = torch.randint(0, cfg.vocab, (4, cfg.seq), generator=torch.Generator().manual_seed(1))
    targets = torch.roll(ids, -1, 1)
    denom = ids.numel()
    ref = build_model(cfg, 0, torch.float64)
    want = sum(float(forward_backward(ref.layers, ids[i:i + 2], targets[i:i + 2], denom, "autograd"))
               for i in (0, 2))
    model = build_model(cfg, 0, torch.float64)
    chunk, hooks = Chunk(0, 0, 1, model.layers), LayerHooks()
    loss0, ctxs0, aux0 = drive(forward_steps(chunk, ids[:2], targets[:2], denom, hooks))
    fwd = ForwardParts(chunk, ids[2:], targets[2:], denom, hooks)
    bwd = BackwardParts(chunk, ctxs0, None, hooks)
    order = chunk_pair_order(chunk, chunk)
    assert [layer_kind(x) for x in chunk.layers] == ["embed", "dense", "moe", "dense", "moe", "head"]
    done = []
    run_pair(order, fwd, bwd, {"F": {"mb": 1}, "B": {"mb": 0}}, lambda: done.append("F"), lambda: done.append("B"))
    assert done == ["F", "B"]
    loss1, _, aux1 = fwd.result()
    assert bwd.dx is None                                   # the embedding takes no input grad
    # finish mb 1's backward the plain way, then compare every grad
    for layer, c in zip(reversed(model.layers), reversed(fwd.ctxs)):
        dy = layer.backward_input(c) if layer is model.layers[-1] else layer.backward_input(c, dy)
        layer.backward_weight(c)
    torch.testing.assert_close(float(loss0 + aux0 + loss1 + aux1), want)
    got, ref_p = model.params(), ref.params()
    for name, prm in ref_p.items():
        torch.testing.assert_close(got[name].grad, prm.grad, msg=lambda m: f"{name}: {m}")


# ---------------------------------------------------------------- end to end

PLANS = {
    "1f1b-pp2-ep2": ["--pp", 2, "--schedule", "1f1b", "--microbatches", 4],
    "dualpipe-pp4-ep2": ["--pp", 4, "--schedule", "dualpipe", "--microbatches", 8, "--batch", 16],
    "dualpipev-pp2-ep2": ["--pp", 2, "--schedule", "dualpipev", "--microbatches", 4],
}


@pytest.mark.parametrize("moe", ["gshard", "deepseek"])
@pytest.mark.parametrize("name", PLANS)
def test_fb_overlap_matches_reference_with_dense_layers_mixed_in(name, moe):
    # deepseek: shared experts, 2 route groups, bias balancing and the sequence loss (deepseek-tiny)
    model = ["--model", "deepseek-tiny", "--seq-aux-alpha", 0.1] if moe == "deepseek" else ["--experts", 4]
    summary = check_plan(*PLANS[name], *model, "--dp", 2, "--ep", 2, "--moe-every", 2, "--fb-overlap",
                         steps=2)
    assert summary["max_abs_loss_err"] <= 2e-5


@pytest.mark.parametrize("args,needle", [
    (["--pp", 2, "--schedule", "1f1b", "--microbatches", 4], "it needs experts"),
    (["--pp", 2, "--schedule", "zb1p", "--microbatches", 4, "--experts", 4],
     "not zb1p: set --schedule 1f1b"),
    (["--experts", 4, "--dp", 2, "--ep", 2], "--fb-overlap pairs a forward with a backward inside a pipeline"),
    (["--pp", 2, "--dp", 2, "--zero", 3, "--schedule", "1f1b", "--microbatches", 4, "--experts", 4],
     "set --zero 2 or no --fb-overlap"),
    (["--pp", 2, "--schedule", "1f1b", "--microbatches", 4, "--experts", 4, "--backward", "autograd"],
     "--fb-overlap"),
], ids=["no-experts", "zb1p", "no-pipeline", "zero3", "autograd"])
def test_bad_fb_overlap_input_exits_2(args, needle):
    proc = run_cli("run", *args, "--fb-overlap", "--steps", 1, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _pairs_and_a2a(events, rank):
    """On one rank: the FB pair spans, the part spans inside them, every all-to-all's issue and its wait."""
    mine = [e for e in events if e.get("pid") == rank and e.get("ph") == "X"]
    pairs = [e for e in mine if e.get("cat") == "FB"]
    parts = sorted((e for e in mine if "part" in e.get("args", {})), key=lambda e: e["ts"])
    a2a = [e for e in mine if e.get("cat") == "comm" and e["args"].get("op") == "all_to_all"]
    waits = {e["args"]["op_id"]: e for e in mine if e.get("cat") == "wait" and "op_id" in e.get("args", {})}
    return pairs, parts, a2a, waits


def test_trace_each_all_to_all_flies_under_the_other_microbatch(tmp_path):
    """DualPipeV pp 2 x ep 2 with a dense layer in each stage pair: inside every F&B pair, each all-to-all is
    issued at the end of a part of one microbatch and, before the rank waits for it (or the part needing it
    starts), a part of the other microbatch computes. Even dispatch: every all-to-all carries rows (uneven
    dispatch adds a blocking exchange of counts inside ATTN, which nothing can hide)."""
    path = tmp_path / "fb.json"
    proc = run_cli("run", "--pp", 2, "--dp", 2, "--ep", 2, "--experts", 4, "--moe-every", 2, "--schedule",
                   "dualpipev", "--microbatches", 4, "--fb-overlap", "--ep-dispatch", "even", "--steps", 1,
                   "--trace", path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = json.loads(path.read_text())["traceEvents"]
    checked = 0
    for rank in range(4):
        pairs, parts, a2a, waits = _pairs_and_a2a(events, rank)
        assert pairs, f"rank {rank} ran no F&B pair"
        for pair in pairs:
            t0, t1 = pair["ts"], pair["ts"] + pair["dur"]
            inside = [p for p in parts if t0 <= p["ts"] <= t1]
            for op in (o for o in a2a if t0 <= o["ts"] <= t1):
                issuer = [p for p in inside if p["ts"] <= op["ts"] <= p["ts"] + p["dur"]]
                assert issuer, f"rank {rank}: all-to-all {op['args']['op_id']} issued outside every part"
                mb = issuer[-1]["args"]["mb"]
                later = [p for p in inside if p["ts"] >= issuer[-1]["ts"] + issuer[-1]["dur"]]
                consumer = next(p for p in later if p["args"]["mb"] == mb)    # the part that needs the rows
                wait = waits.get(op["args"]["op_id"])
                until = min(consumer["ts"], wait["ts"] if wait else consumer["ts"])
                others = [p for p in later if p["args"]["mb"] != mb and p["ts"] < until]
                assert others, (f"rank {rank}: all-to-all {op['args']['op_id']} of mb {mb} "
                                f"({issuer[-1]['name']}) has no part of the other microbatch under it")
                checked += 1
    assert checked >= 8
    report = run_cli("report", path, "--by", "pair", "--format", "json", timeout=120)
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)["rows"]
    assert len(rows) == checked and all(r["all_to_all"].split("(")[0] in ("DISPATCH", "COMBINE") for r in rows)


# ---------------------------------------------------------------- the simulator's chunk-level costs

def test_part_costs_of_one_moe_layer_by_hand():
    """ATTN = MLP = A2A = 1, COMBINE 0, B and W as the forward. Alone: F = 1 + 1 + 1 + 1 (ATTN, DISPATCH, MLP,
    COMBINE's a2a) = 4; BW = a2a + MLP_B + a2a + ATTN_B + MLP_W + ATTN_W = 6, W = 2. The pair: B COMBINE
    (0 long) issues COMBINE(B) 0-1 under F ATTN 0-1; DISPATCH(F) 1-2 under B MLP 1-2; DISPATCH(B) 2-3 under
    F MLP 2-3; COMBINE(F) 3-4 under B ATTN 3-4; F COMBINE at 4, then MLP_W 4-5, ATTN_W 5-6: 6 long, every
    all-to-all hidden."""
    parts = PartCost()
    cost = cost_from_parts(parts, fb_overlap=True)
    assert (cost.F, cost.B, cost.W, cost.fb) == (4, 6, 2, 6)
    assert cost_from_parts(parts, fb_overlap=False).fb == 10
    serial = pair_timeline(parts, overlapped=False)
    assert serial.makespan == 10 and serial.exposed_comm == 4                # every all-to-all waited at once
    tl = pair_timeline(parts)
    assert [(b, e, label) for b, e, label, _ in tl.comm] == [
        (0, 1, "COMBINE(B) L0"), (1, 2, "DISPATCH(F) L0"), (2, 3, "DISPATCH(B) L0"), (3, 4, "COMBINE(F) L0")]
    assert tl.exposed_comm == 0
    two = pair_timeline(PartCost(layers=2))
    assert two.makespan == 12 and two.exposed_comm == 0          # vs 2 x 10 = 20 one side after the other
    head = pair_order(["moe", "moe", "head"], ["moe", "moe", "head"])
    assert run_parts(head, PartCost()).exposed_comm == 0           # the head's backward covers DISPATCH(F)


def test_simulate_cli_draws_the_pair_and_refuses_two_cost_models():
    proc = run_cli("simulate", "--schedule", "dualpipev", "--pp", 2, "--microbatches", 8, "--parts",
                   "ATTN=1,MLP=1,A2A=1", "--fb-overlap", "--timeline", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "pair 6 vs 10 one side after the other; all-to-all 4, exposed 0 (100% hidden)" in proc.stdout
    assert "B MLP L0       under DISPATCH(F) L0" in proc.stdout
    proc = run_cli("simulate", "--schedule", "1f1b", "--pp", 2, "--microbatches", 4, "--parts", "A2A=1",
                   "--cost", "F=1", timeout=60)
    assert proc.returncode == 2 and "give --cost or --parts, not both" in proc.stderr
    proc = run_cli("simulate", "--schedule", "zb1p", "--pp", 2, "--microbatches", 4, "--fb-overlap", timeout=60)
    assert proc.returncode == 2 and "fb_overlap runs the overlapped F&B pairs" in proc.stderr
