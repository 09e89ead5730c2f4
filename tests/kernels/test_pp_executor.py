"""Pipeline executor end to end: every schedule's loss and gradients equal the single-process reference
(pp 2 and 4, and with dp 2), the stage split, and bad pipeline input exits 2 with a clear message."""
import collections
import json

import pytest

from conftest import check_plan, run_cli
from planning.config import ModelConfig
from kernels.model import build_model
from planning.pipeline.catalog import build_schedule
from kernels.pp.stages import build_chunks, split_stages

pytestmark = pytest.mark.timeout(300)

# (pp, schedule, extra flags): 8 layers where 4 do not divide the stages (interleaved and dualpipev at pp 4)
PLANS = [
    (2, "gpipe", ["--microbatches", 4]),
    (2, "1f1b", ["--microbatches", 4]),
    (2, "interleaved", ["--microbatches", 4, "--virtual-stages", 2]),
    (2, "zb1p", ["--microbatches", 4]),
    (2, "dualpipe", ["--microbatches", 4]),
    (2, "dualpipev", ["--microbatches", 4]),
    (4, "gpipe", ["--microbatches", 4]),
    (4, "1f1b", ["--microbatches", 8]),
    (4, "interleaved", ["--microbatches", 4, "--virtual-stages", 2, "--layers", 8]),
    (4, "zb1p", ["--microbatches", 8]),
    (4, "dualpipe", ["--microbatches", 8]),
    (4, "dualpipev", ["--microbatches", 8, "--layers", 8]),
]


def _id(plan):
    return f"{plan[1]}-pp{plan[0]}"


@pytest.mark.parametrize("plan", PLANS, ids=_id)
def test_schedule_matches_reference(plan):
    pp, schedule, extra = plan
    summary = check_plan("--pp", pp, "--schedule", schedule, *extra, steps=2)
    assert summary["max_abs_grad_err"] <= 2e-5
    roles = [r["role"] for r in summary["ranks"]]
    assert len(roles) == pp and all(f"pp rank {i} of {pp}" in roles[i] for i in range(pp))
    assert "embed" in roles[0] and "head" in roles[0 if schedule in ("dualpipe", "dualpipev") else pp - 1]


@pytest.mark.parametrize("plan", PLANS, ids=_id)
def test_schedule_with_dp2_matches_reference(plan):
    pp, schedule, extra = plan
    # each dp rank runs every microbatch of its half of the batch: batch 16 keeps 8 microbatches of one
    summary = check_plan("--pp", pp, "--dp", 2, "--schedule", schedule, "--batch", 16, *extra, steps=2)
    assert summary["world"] == 2 * pp
    assert summary["max_abs_grad_err"] <= 2e-5


@pytest.mark.parametrize("schedule, extra", [("1f1b", []), ("zb1p", ["--sp"]), ("dualpipev", ["--sp"])])
def test_schedule_with_tp2_matches_reference(schedule, extra):
    """Tensor parallel inside each stage (f/g, and sequence parallel's gather / scatter) under a split W."""
    summary = check_plan("--pp", 2, "--tp", 2, "--schedule", schedule, "--microbatches", 4, *extra, steps=2)
    assert summary["world"] == 4
    assert summary["max_abs_grad_err"] <= 2e-5
    roles = [r["role"] for r in summary["ranks"]]
    assert sum("pp rank 0 of 2" in r for r in roles) == 2      # two tp ranks share each stage


def test_stage_split_keeps_only_own_layers():
    layers = build_model(ModelConfig(layers=8), seed=0).layers
    per_stage = split_stages(layers, 4)
    assert [len(s) for s in per_stage] == [3, 2, 2, 3]       # embed + 2 blocks, 2, 2, 2 blocks + head
    s = build_schedule("dualpipev", 2, 4)
    chunks = build_chunks(layers, s, pp_rank=0)              # rank 0 of a 4-stage V: stages 0 and 3
    names = sorted(n for ch in chunks for n in ch.params())
    assert [ch.stage for ch in chunks] == [0, 3]
    assert "embed.weight" in names and "lm_head.weight" in names
    assert not any(n.startswith(("layers.2.", "layers.3.", "layers.4.", "layers.5.")) for n in names)
    assert any(n.startswith("layers.6.") for n in names) and any(n.startswith("layers.1.") for n in names)


def test_dualpipe_ranks_hold_mirrored_stages():
    layers = build_model(ModelConfig(layers=4), seed=0).layers
    s = build_schedule("dualpipe", 4, 8)
    r0 = [ch.stage for ch in build_chunks(layers, s, 0)]
    r3 = [ch.stage for ch in build_chunks(layers, s, 3)]
    assert r0 == [0, 3] and r3 == [3, 0]                      # the same two stages, one copy per direction


@pytest.mark.parametrize("args,needle", [
    (["--pp", 4, "--schedule", "dualpipev", "--microbatches", 8], "not divisible by 8 pipeline stages"),
    (["--pp", 3, "--schedule", "dualpipe", "--microbatches", 6, "--batch", 12, "--layers", 3], "even number of pipeline ranks"),
    (["--pp", 4, "--schedule", "1f1b", "--microbatches", 2], "1f1b needs microbatches >= pp = 4"),
    (["--pp", 2, "--schedule", "dualpipe", "--microbatches", 2], "microbatches >= 2 x pp = 4"),
], ids=["layers-not-divisible", "odd-pp-dualpipe", "too-few-microbatches-1f1b", "too-few-microbatches-dualpipe"])
def test_bad_pipeline_input_exits_2(args, needle):
    proc = run_cli("run", *args, "--steps", 1, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr, proc.stderr


def test_trace_spans_follow_the_schedule(tmp_path):
    """Every F / B / W / FB of a traced dualpipev step shows in the trace, with microbatch, chunk and stage."""
    path = tmp_path / "pp.json"
    proc = run_cli("run", "--pp", 2, "--schedule", "dualpipev", "--microbatches", 4, "--steps", 1,
                   "--trace", path, "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("F", "B", "W", "FB")]
    assert all({"mb", "chunk", "stage"} <= set(e.get("args", {})) for e in spans)
    got = collections.Counter((e["pid"], e["cat"]) for e in spans)
    s = build_schedule("dualpipev", 2, 4)
    want = collections.Counter((r, "B" if a.kind == "BW" else a.kind) for r, acts in enumerate(s.actions)
                               for a in acts if a.kind in ("F", "B", "BW", "W", "FB"))
    assert got == want


def test_moe_aux_loss_through_split_backward():
    """MoE blocks on every stage: their aux loss joins the loss there, and deferred W covers the experts."""
    summary = check_plan("--pp", 2, "--schedule", "zb1p", "--microbatches", 4, "--experts", 4, steps=2)
    assert summary["max_abs_loss_err"] <= 2e-5
