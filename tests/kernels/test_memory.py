"""The memory account (kernels/memory.py): its arithmetic on hand-built inputs, each schedule's
peak of in-flight activations against its published table at pp 4 x 8 microbatches, DualPipe's
2x parameters, ZeRO's per-kind bytes against the paper, full and selective recompute's bytes
against the model's shapes, and the account's total against an independent walk of every tensor
alive in the rank process."""
import gc

import pytest
import torch

from worlds import run_world
from planning.config import make_config, param_shapes
from kernels.engine import Engine
from kernels.layers import Ctx
from kernels.memory import HeldDict, MemoryAccount, account_of, saved_bytes
from planning.memory_kinds import KINDS
from kernels.memory_plan import predict_rank
from planning.mesh import Plan
from kernels.pp import step as pipeline_step

P, M = 4, 8      # the done-when's pipeline: 4 ranks, 8 microbatches


# ---------------------------------------------------------------- arithmetic, by hand

def test_saved_bytes_counts_each_storage_once():
    a = torch.zeros(4, 4)                       # 64 bytes
    b = torch.zeros(10, dtype=torch.bfloat16)   # 20 bytes
    c = torch.zeros(3, dtype=torch.int64)       # 24 bytes
    ctx = Ctx(x=a, view=a[1:], inner=Ctx(b=b, again=a.t()), rest=[c, {"b": b}], shape=(4, 4),
              scale=2.0, empty=torch.empty(0))
    assert saved_bytes(ctx) == 64 + 20 + 24
    assert saved_bytes(a[2:]) == 64             # a view keeps its whole storage alive
    assert saved_bytes([None, 3, "x"]) == 0


def test_account_peak_names_the_action_and_each_kind_then():
    acc = MemoryAccount()
    acc.set("params", 100)
    acc.at("F mb0")
    acc.hold("activations", "mb0", 40)
    acc.hold("comm", "recv0", 10)
    acc.at("F mb1")
    acc.hold("activations", "mb1", 50)          # peak: 100 + 40 + 10 + 50 = 200
    acc.at("B mb0")
    acc.drop("activations", "mb0")
    acc.drop("comm", "recv0")
    acc.hold("activations", "mb1", 60)          # an entry re-held with more (a W queue's dy)
    acc.drop("activations", "never held")       # nothing: no error, no change
    fig = acc.take()["memory"]
    assert fig["peak"] == 200 and fig["peak_at"] == "F mb1"
    assert fig["peak_kinds"] == {**dict.fromkeys(KINDS, 0), "params": 100, "activations": 90,
                                 "comm": 10}
    assert fig["kind_peaks"]["activations"] == 90 and fig["kind_peaks"]["comm"] == 10
    assert fig["peak_activation_entries"] == 2
    assert fig["now"]["activations"] == 60 and acc.total == 160
    nxt = acc.take()["memory"]                  # the next step starts from what is held now
    assert nxt["peak"] == 160 and nxt["peak_activation_entries"] == 1


def test_held_dict_holds_what_sits_in_it():
    acc = MemoryAccount()
    saved = HeldDict(acc, "activations", "saved")
    saved[(0, 0)] = [torch.zeros(8), torch.zeros(2)]        # 32 + 8 bytes
    saved[(1, 0)] = Ctx(x=torch.zeros(4))                   # 16
    assert acc.bytes["activations"] == 56 and acc.entries["activations"] == 2
    saved.pop((0, 0))
    assert acc.bytes["activations"] == 16 and acc.entries["activations"] == 1


# ---------------------------------------------------------------- schedules against their table

def _pipeline_rank(rank, size, schedule, layers):
    torch.set_num_threads(1)
    plan = Plan(pp=P, microbatches=M, schedule=schedule,
                virtual_stages=2 if schedule == "interleaved" else 1)
    eng = Engine(plan, make_config("tiny", layers=layers), rank)
    return {**eng.step().extra["memory"], "predicted": predict_rank(eng)}


def interleaved_peak(rank: int, v: int = 2) -> int:
    """Megatron's interleaved 1F1B (Narayanan et al. 2021): (P - r - 1) x 2 + (v - 1) x P warm-up
    forwards of one chunk each, then one more before the first backward; at most v x M."""
    return min((P - rank - 1) * 2 + (v - 1) * P + 1, v * M)


# each rank's most microbatch-chunk contexts held at once (a chunk = one stage of the schedule)
TABLE = {
    "gpipe": lambda r: M,
    "1f1b": lambda r: min(P - r, M),
    "interleaved": interleaved_peak,
    "zb1p": lambda r: P,             # 1F1B's warm-up, the deferred W holding the rest: PP on every rank
    "dualpipe": lambda r: P + 1,     # DualPipe's README: PP + 1
    "dualpipev": lambda r: 2 * P + 1,  # PP counts stages there: 2 x ranks
}
LAYERS = {"interleaved": 8, "dualpipev": 8}     # one block per stage at least


@pytest.mark.timeout(600)
def test_each_schedule_peak_activations_equal_its_table():
    got = {s: run_world(P, _pipeline_rank, s, LAYERS.get(s, 4), timeout_s=200) for s in TABLE}
    for schedule, expect in TABLE.items():
        peaks = [m["peak_activation_entries"] for m in got[schedule]]
        assert peaks == [expect(r) for r in range(P)], (schedule, peaks)
    # DualPipe holds two stages per rank, r and P-1-r: 1F1B's parameters of both
    one = [m["kind_peaks"]["params"] for m in got["1f1b"]]
    two = [m["kind_peaks"]["params"] for m in got["dualpipe"]]
    assert two == [one[r] + one[P - 1 - r] for r in range(P)]
    # per microbatch of one stage the contexts weigh the same, so bytes follow the count:
    # GPipe's rank 1 holds M of them, 1F1B's rank 1 P - 1
    gp, fb = got["gpipe"][1]["kind_peaks"], got["1f1b"][1]["kind_peaks"]
    assert gp["activations"] * (P - 1) == fb["activations"] * M
    # the formula (kernels/memory_plan.py) against the measure: exact where every in-flight
    # context is a whole forward's (GPipe, 1F1B); an upper bound where a rank's chunks differ
    # (DualPipe's ends, interleaved's last) or a B has freed part of what its W keeps (ZB1P)
    for schedule, ranks in got.items():
        for m in ranks:
            measured, predicted = m["kind_peaks"]["activations"], m["predicted"]["activations"]
            assert measured == predicted if schedule in ("gpipe", "1f1b") else \
                0 < measured <= predicted, (schedule, measured, predicted)
            assert m["predicted"]["activation_microbatches"] == m["peak_activation_entries"]
            assert all(m["predicted"][k] == m["kind_peaks"][k] for k in ("params", "grads",
                                                                         "optimizer"))


def _recompute_rank(rank, size):
    torch.set_num_threads(1)
    plan = Plan(pp=P, microbatches=M, schedule="1f1b", recompute="full")
    eng = Engine(plan, make_config("tiny", layers=2 * P), rank)
    return {**eng.step().extra["memory"], "predicted": predict_rank(eng)}


@pytest.mark.timeout(300)
def test_full_recompute_keeps_one_layer_input_per_in_flight_microbatch():
    cfg = make_config("tiny")
    b, per_stage = cfg.batch // M, 2                   # 2 blocks a stage
    one_input = 4 * b * cfg.seq * cfg.dim              # fp32 [b, s, dim]
    got = run_world(P, _recompute_rank, timeout_s=200)
    for r in (1, 2):                                   # blocks only: no embed, no head
        in_flight = min(P - r, M)
        assert got[r]["peak_activation_entries"] == in_flight
        assert got[r]["kind_peaks"]["activations"] == in_flight * per_stage * one_input
    assert [m["kind_peaks"]["activations"] for m in got] == \
        [m["predicted"]["activations"] for m in got]   # the formula knows recompute too


def _single_rank(rank, size, recompute):
    torch.set_num_threads(1)
    eng = Engine(Plan(microbatches=2, recompute=recompute), make_config("tiny"), rank)
    return {**eng.step().extra["memory"], "predicted": predict_rank(eng)}


@pytest.mark.timeout(200)
def test_without_a_pipeline_one_microbatch_of_every_layer_is_in_flight():
    cfg = make_config("tiny")
    full, none = (run_world(1, _single_rank, mode, timeout_s=100)[0] for mode in ("full", "none"))
    for m in (full, none):
        assert m["peak_activation_entries"] == 1
        assert m["kind_peaks"]["activations"] == m["predicted"]["activations"]
    b = cfg.batch // 2                                  # embed: int64 ids and a bool mask a token
    assert full["kind_peaks"]["activations"] == cfg.layers * 4 * b * cfg.seq * cfg.dim \
        + 9 * b * cfg.seq


def selective_block_bytes(cfg, b: int) -> int:
    """What a block keeps under selective, listed from the model's own weight shapes (fp32)."""
    shapes = param_shapes(cfg)
    pre = "layers.0."
    q_out = shapes[pre + "attn.wq.weight"][0]               # heads x head_dim
    kv_out = shapes[pre + "attn.wk.weight"][0]              # kv_heads x head_dim
    hidden = shapes[pre + "mlp.w1.weight"][0]
    t = b * cfg.seq
    kept = [t * cfg.dim, t * cfg.dim,                       # x and h, the norms' inputs
            t * q_out, t * kv_out, t * kv_out,              # q, k (after RoPE), v
            t * q_out, t * q_out,                           # o, and wo's input
            t * hidden, t * hidden]                         # h1, h3
    return 4 * sum(kept)


@pytest.mark.timeout(300)
def test_selective_activations_lie_between_full_and_none_to_the_byte():
    cfg = make_config("tiny")
    got = {mode: run_world(1, _single_rank, mode, timeout_s=100)[0]
           for mode in ("none", "selective", "full")}
    peaks = {mode: m["kind_peaks"]["activations"] for mode, m in got.items()}
    assert peaks["full"] < peaks["selective"] < peaks["none"], peaks
    b = cfg.batch // 2                                      # embed: int64 ids and a bool mask
    assert peaks["selective"] == cfg.layers * selective_block_bytes(cfg, b) + 9 * b * cfg.seq
    assert peaks["selective"] == got["selective"]["predicted"]["activations"]


# ---------------------------------------------------------------- ZeRO against the paper

def _zero_rank(rank, size, stage):
    torch.set_num_threads(1)
    eng = Engine(Plan(dp=size, zero=stage), make_config("tiny"), rank)
    eng.step()                                   # the first step records the gather order
    return eng.step().extra["memory"]            # the second prefetches by it


def layer_bytes(cfg) -> list[int]:
    """fp32 bytes of each layer's parameters (embed, each block, the head's norm and lm_head)."""
    per = {}
    for name, shape in param_shapes(cfg).items():
        key = ".".join(name.split(".")[:2]) if name.startswith("layers.") else (
            "embed" if name.startswith("embed") else "head")
        per[key] = per.get(key, 0) + 4 * torch.Size(shape).numel()
    return sorted(per.values(), reverse=True)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_kinds_equal_the_paper(stage):
    cfg, n = make_config("tiny"), 4
    psi = sum(torch.Size(s).numel() for s in param_shapes(cfg).values())   # divisible by 4
    expect = {"params": 4 * psi // (n if stage == 3 else 1),          # fp32: p = g = 4, Adam K = 8
              "grads": 4 * psi // (n if stage >= 2 else 1),
              "optimizer": 8 * psi // n}
    for mem in run_world(n, _zero_rank, stage, timeout_s=200):
        assert {k: mem["now"][k] for k in expect} == expect
        gathered = mem["kind_peaks"]["gathered"]
        if stage == 3:   # with prefetch: the layer in use and the next one's all-gather in flight
            assert 0 < gathered <= sum(layer_bytes(cfg)[:2]), (gathered, layer_bytes(cfg))
        else:
            assert gathered == 0


# ---------------------------------------------------------------- the account against live tensors

def live_tensor_bytes(skip: set) -> int:
    """Every tensor the process holds, found by the garbage collector: distinct storages' bytes."""
    seen, total = set(skip), 0
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor):
            st = obj.untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                total += st.nbytes()
    return total


def _sampled_rank(rank, size, moments):
    torch.set_num_threads(1)
    from kernels.data import corpus_tokens   # the dataset cache: the process's, not training state
    skip = {corpus_tokens().untyped_storage().data_ptr()}
    eng = Engine(Plan(pp=size, microbatches=4, schedule="1f1b"), make_config("tiny", layers=4),
                 rank)
    eng.step()                     # grads and the optimizer's scratch exist from now on
    memory, samples, actions = account_of(eng.ctx.stats), [], []
    do = pipeline_step.PipelineStep.do

    def sampled_do(self, a):
        do(self, a)
        actions.append(a)
        if len(actions) in moments:
            samples.append((str(a), memory.total, live_tensor_bytes(skip)))
    pipeline_step.PipelineStep.do = sampled_do
    try:
        eng.step()
    finally:
        pipeline_step.PipelineStep.do = do
    return samples


@pytest.mark.timeout(300)
def test_account_total_is_within_5pct_of_live_tensors():
    moments = (2, 5, 8)
    for rank, samples in enumerate(run_world(2, _sampled_rank, moments, timeout_s=200)):
        assert len(samples) == len(moments)
        for action, account, live in samples:
            assert abs(account - live) <= 0.05 * live, (rank, action, account, live)
