"""A plan's memory estimated from its sizes before anything is built (planning/memory_estimate.py),
and the refusal of a plan whose world would not fit: the estimate pinned on the tiny model by hand,
equal to memory_plan's prediction from the built (dry) engines wherever both exist, the refusal
from `partui plan`, `partui run` and build_plan before torch or partui.world.layout loads, and each
suggested fix itself under the limit."""
import re
import subprocess
import sys

import pytest

from conftest import ROOT, run_here
from partui.world.layout import plan_layout
from partui.world.plans import build_plan
from planning.memory_estimate import estimate_plan, estimate_rank
from planning.memory_fit import LIMIT_ENV
from planning.mesh import PlanError


def test_the_tiny_model_by_hand():
    """tiny: vocab 256, dim 64, 4 layers, 4 heads (head dim 16), 2 kv heads, SwiGLU hidden
    round(8 x 64 / 3 / 16) x 16 = 176, seq 32, batch 8; one rank, fp32, AdamW (8 bytes a param)."""
    block = 2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 176 * 64       # norms, wq wo, wk wv, w1 w3 w2
    psi = 256 * 64 + 4 * block + 64 + 256 * 64                        # embed, blocks, norm + lm_head
    assert (block, psi) == (46208, 217664)
    t = 8 * 32                                                        # tokens of the one microbatch
    saved_block = 4 * (2 * (t * 64 + t) + 2 * t * 64                  # norms' xhat, rstd; outputs
                       + t * 16 * (4 + 2 * 2) + 2 * t * 4 * 16 + 8 * 4 * 32 * 32   # q k v, o x2, probs
                       + 5 * t * 176)                                 # h1, h3, sig, act, w2's input
    saved_embed = (8 + 1) * t                                         # int64 ids, bool mask
    plan, cfg = build_plan("single")
    est = estimate_rank(plan, cfg, 0)
    assert {k: est[k] for k in ("params", "grads", "optimizer", "gathered", "activations", "peak")} \
        == {"params": 4 * psi, "grads": 4 * psi, "optimizer": 8 * psi, "gathered": 0,
            "activations": 4 * saved_block + saved_embed,
            "peak": 16 * psi + 4 * saved_block + saved_embed}
    assert est["peak"] == 9719040 and not est["approximate"]
    assert estimate_plan(plan, cfg)["total"] == 9719040


AGREE = [("single", {}), ("zero3", {"dp": 2}), ("zero1", {"dp": 2, "dtype": "bf16"}),
         ("custom", {"pp": 2, "microbatches": 4}),
         ("custom", {"pp": 2, "schedule": "dualpipev", "microbatches": 4}),
         ("custom", {"pp": 2, "schedule": "dualpipe", "microbatches": 4}),
         ("custom", {"pp": 2, "schedule": "interleaved", "microbatches": 4}),
         ("custom", {"pp": 2, "schedule": "gpipe", "microbatches": 2, "recompute": "selective"}),
         ("custom", {"dp": 2, "zero": 2, "recompute": "full"}),
         ("tp", {}), ("gshard", {}), ("ring", {})]


@pytest.mark.parametrize("preset,fields", AGREE, ids=[f"{p}-{f}" for p, f in AGREE])
def test_the_estimate_is_memory_plans_prediction_wherever_both_exist(preset, fields):
    """Every rank of the built (dry) engines: model state equal kind by kind on every plan (the
    ledger's ZeRO formula), activations and the peak where memory_plan predicts them."""
    plan, cfg = build_plan(preset, "tiny", None, **fields)
    for rank in plan_layout(plan, cfg):
        pred, est = rank["predicted"], rank["estimated"]
        for kind in ("params", "grads", "optimizer", "gathered", "activation_microbatches"):
            assert est[kind] == pred[kind], (rank["rank"], kind)
        if pred["activations"] is not None:
            assert (est["activations"], est["peak"]) == (pred["activations"], pred["peak"])
            assert not est["approximate"]
        else:
            assert est["approximate"] and est["activations"] > 0


def test_plan_prints_the_estimate_beside_the_prediction():
    out = run_here("plan", check_rc=0).stdout
    head, row = [ln for ln in out.splitlines() if ln.startswith(("rank  params MiB", "0  "))][-2:]
    assert head.split()[-2:] == ["estimate", "MiB"]
    assert row.split()[-1] == "9.27"          # 9719040 bytes, as the prediction's peak beside it


@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_huge_plan_is_refused_naming_the_estimate_the_limit_and_a_fix(command):
    proc = run_here(command, "--batch", "100000", "--dim", "100000", check_rc=2)
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"partui {command}: this plan needs an estimated 108290.1 GiB (world 1 x")
    assert "this machine has available (MemAvailable): try --dim 8" in line, line
    assert not proc.stdout


def test_the_refusal_comes_before_torch_or_the_layout_load():
    code = ("import sys\nfrom partui.cli import main\nrc = main(sys.argv[1:])\n"
            "print(rc, 'torch' in sys.modules, 'partui.world.layout' in sys.modules, 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, "plan", "--batch", "100000", "--dim", "100000"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "needs an estimated 108290.1 GiB" in out.stderr, out.stderr
    assert out.stdout.split() == ["2", "False", "False", "False"], (out.stdout, out.stderr[-1000:])


def test_each_suggested_fix_fits_under_the_limit(monkeypatch):
    """dp 2 of tiny at batch 64 is 2 x 27.1 = 54.2 MiB; under a 52 MiB limit the fixes are half the
    dim (26.4 MiB), batch (30.4) or layers (27.6), or ZeRO-3 (51.6), and each builds under it."""
    monkeypatch.setenv(LIMIT_ENV, "52")
    with pytest.raises(PlanError) as refused:
        build_plan("dp", "tiny", {"batch": 64}, dp=2)
    message = str(refused.value)
    assert message.startswith("this plan needs an estimated 54.2 MiB (world 2 x up to 27.1 MiB a rank")
    assert "more than the 52.0 MiB this machine has available (PARTUI_MEMORY_LIMIT_MIB): try " in message
    fixes = re.findall(r"(\w+)=(\d+)", message.split(": try ")[1])
    assert fixes == [("dim", "32"), ("batch", "32"), ("layers", "2"), ("zero", "3")]
    for name, value in fixes:
        model = {"batch": 64, **({name: int(value)} if name != "zero" else {})}
        plan, cfg = build_plan("dp", "tiny", model, dp=2, **({"zero": 3} if name == "zero" else {}))
        assert estimate_plan(plan, cfg)["total"] <= 52 * 2**20


@pytest.mark.parametrize("value", ["lots", "0", "-5", "nan", "inf"])
def test_a_bad_limit_is_refused_naming_the_fix(monkeypatch, value):
    monkeypatch.setenv(LIMIT_ENV, value)
    with pytest.raises(PlanError, match=f"{LIMIT_ENV}={value!r} .*set it to e.g. 4096, or unset it"):
        build_plan("single")


def test_the_estimate_column_has_its_record():
    from partui.analysis.figures.definitions import PLAN, figure_of, view_figures
    assert figure_of("estimate MiB").unit == "MiB" and view_figures(PLAN) == ["estimate MiB"]
