"""DeepSeek-V3's MoE end to end: `--check` (loss, every grad, every param and the routing figures
against the single-process reference, step by step) at ep 2 and 4, alone and with dp 2 x tp 2,
pp 2 (DualPipeV) and ZeRO-3; bad DeepSeek flags exit 2 naming the flag and a fix."""
import pytest

from conftest import check_plan, run_cli

# shared experts, 2 route groups (top-1 group), bias balancing (the 2nd step routes with a bias),
# and a sequence-wise loss weight large enough that its gradient shows in the check
DS = ("--model", "deepseek-tiny", "--seq-aux-alpha", 0.1)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("args", [
    ("--ep", 2, "--world", 2),
    ("--ep", 4, "--world", 4),
    ("--ep", 2, "--world", 2, "--capacity-factor", 0.75, "--ep-dispatch", "even"),
    ("--ep", 2, "--world", 2, "--overlap", "--route-groups", 4, "--route-topk-groups", 2),
    ("--ep", 2, "--dp", 2, "--tp", 2),
    ("--ep", 2, "--dp", 2, "--pp", 2, "--schedule", "dualpipev", "--microbatches", 4),
    ("--ep", 2, "--world", 2, "--zero", 3),
    ("--ep", 4, "--world", 4, "--zero", 3),
], ids=["ep2", "ep4", "ep2-capacity-even", "ep2-overlap-4groups", "dp2tp2ep2", "pp2-dualpipev-ep2",
        "ep2-zero3", "ep4-zero3"])
def test_deepseek_moe_matches_reference(args):
    summary = check_plan(*DS, *args, steps=2)
    assert summary["model"]["moe"] == "deepseek" and summary["model"]["shared_experts"] == 1


@pytest.mark.parametrize("args,message", [
    (("--experts", 4, "--shared-experts", 1),
     "--shared-experts 1 is DeepSeek routing, but --moe gshard: add --moe deepseek"),
    (("--model", "deepseek-tiny", "--route-groups", 3),
     "--route-groups 3 must divide the 8 experts: pick --route-groups in 1, 2, 4, 8"),
    (("--model", "deepseek-tiny", "--route-topk-groups", 3),
     "--route-topk-groups 3 must be between 1 and --route-groups 2"),
    (("--model", "deepseek-tiny", "--top-k", 8),
     "--top-k 8 is more than the 4 experts in --route-topk-groups 1 groups of 4"),
    (("--model", "deepseek-tiny", "--seq-aux-alpha", -1), "--seq-aux-alpha -1.0 must be >= 0"),
    (("--model", "deepseek-tiny", "--bias-gamma", -1), "--bias-gamma -1.0 must be >= 0"),
    (("--moe", "deepseek",), "--moe deepseek routes tokens to experts, but the model has none"),
    (("--model", "deepseek-tiny", "--balance", "aux"), "unknown balance 'aux' (the balance choices: none, bias): pick balance in none, bias"),
])
def test_bad_deepseek_input_exits_2(args, message):
    proc = run_cli("run", *args, "--steps", 1, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr, proc.stderr
