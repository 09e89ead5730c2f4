"""The Plan's fields grouped by concern (planning.mesh's section classes): each field's spec
names its section, the Plan reads flat, and `partui run --help` prints a group per section."""
from __future__ import annotations

from planning import mesh
from tests.conftest import run_here


def test_each_field_names_its_section_in_field_order():
    sections = {}
    for spec in mesh.field_specs():
        sections.setdefault(spec.section, []).append(spec.name)
    assert list(sections) == ["parallelism", "model / MoE", "training", "observation"]
    assert sections["training"] == ["dtype", "collectives", "recompute"]
    assert sections["observation"] == ["slow_rank", "slow_stage"]
    assert sections["parallelism"][-3:] == ["ep", "overlap", "ep_dispatch"]
    assert sections["model / MoE"][:2] == ["experts", "top_k"]


def test_a_plan_reads_flat_across_sections():
    plan = mesh.Plan(pp=2, experts=4, dtype="bf16", slow_rank="1=2")
    assert (plan.pp, plan.experts, plan.dtype, plan.slow_rank) == (2, 4, "bf16", "1=2")
    assert isinstance(plan, mesh.ParallelFields) and isinstance(plan, mesh.ObservationFields)


def test_run_help_prints_a_flag_group_per_section():
    text = run_here("run", "--help").stdout
    heads = [ln.split(" (")[0] for ln in text.splitlines() if ln.startswith("plan: ")]
    assert heads == ["plan: parallelism", "plan: model / MoE", "plan: training", "plan: observation"]
    assert text.index("\n  --schedule") < text.index("\nplan: model / MoE") < text.index("\n  --experts")
