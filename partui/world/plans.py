"""The one plan builder: presets, defaults and validation for the CLI, World, the app and the benches.

    plan, cfg = build_plan("zero2", "tiny", {"layers": 2}, dp=4)

Messages name Plan fields (`microbatches=8`, `virtual_stages`): the app's command line takes them as
they are, the CLI turns them into flags (partui.commands.flags.FLAG_OF).
Light to import (no torch until a plan is built), so the app can list PRESETS before its first frame.
"""
from __future__ import annotations

from planning.config import make_config
from planning.memory_fit import check_fits
from planning.mesh import NAMED_DIMS, Plan, PlanError
from planning.pipeline.catalog import CATALOG, schedule_spec
from planning.slow_spec import check_slow
from planning.validate import plan_for_model

# name -> (label, plan fields); "custom" is whatever the mesh editor holds
PRESETS: dict[str, tuple[str, dict]] = {
    "single": ("single process", {}),
    "dp": ("DP naive", {"dp": 2, "grad_sync": "naive"}),
    "dp-bucketed": ("DP bucketed", {"dp": 2, "grad_sync": "bucketed"}),
    "zero1": ("ZeRO-1", {"dp": 2, "zero": 1}),
    "zero2": ("ZeRO-2", {"dp": 2, "zero": 2}),
    "zero3": ("ZeRO-3", {"dp": 2, "zero": 3}),
    "tp": ("TP", {"tp": 2}),
    "tp-sp": ("TP + SP", {"tp": 2, "sp": True}),
    # a preset per schedule of the catalogue (planning/pipeline/catalog.py): pp 2, 4 microbatches
    **{s.name: (s.preset_label, {"pp": 2, "schedule": s.name, "microbatches": 4})
       for s in CATALOG.values()},
    "ring": ("CP ring", {"cp": 2, "cp_mode": "ring"}),
    "zigzag": ("CP zigzag", {"cp": 2, "cp_mode": "zigzag"}),
    "ulysses": ("CP Ulysses", {"cp": 2, "cp_mode": "ulysses"}),
    "gshard": ("EP GShard", {"dp": 2, "ep": 2, "experts": 4}),
    "deepseek": ("EP DeepSeek-V3", {"dp": 2, "ep": 2, "experts": 8, "moe": "deepseek",
                                    "moe_hidden": 48, "shared_experts": 1, "route_groups": 2,
                                    "seq_aux_alpha": 1e-4, "balance": "bias"}),
    "custom": ("custom", {}),
}
MODEL_FIELDS = ("layers", "dim", "heads", "kv_heads", "seq", "batch", "vocab", "hidden", "moe_every")
BACKWARDS = ("hand", "autograd")


def preset_fields(preset: str = "custom", **fields) -> dict:
    """The Plan fields a preset and overrides give (None: not given), with the defaults decided here."""
    key = preset.lower().replace("_", "-")
    if key not in PRESETS:
        raise PlanError(f"unknown preset {preset!r}: pick one of {', '.join(PRESETS)}")
    kw = dict(PRESETS[key][1])
    kw.update({k: v for k, v in fields.items() if v is not None})
    unknown = sorted(set(kw) - set(Plan.__dataclass_fields__))
    if unknown:
        raise PlanError(f"unknown plan field {unknown[0]}: plan fields are "
                        f"{', '.join(Plan.__dataclass_fields__)}")
    spec = schedule_spec(kw["schedule"]) if kw.get("schedule") in CATALOG else None
    if spec and spec.virtual and "virtual_stages" not in kw:
        kw["virtual_stages"] = spec.default_virtual   # an explicit 1 goes on to validate, which refuses it
    return kw


def build_plan(preset: str = "custom", model: str = "tiny", model_overrides: dict | None = None,
               **fields):
    """(validated Plan, ModelConfig with the plan's MoE fields) from a preset, a model preset and its
    overrides (layers, dim, ...), and Plan field overrides; PlanError / ValueError naming the problem,
    a plan whose estimated memory exceeds this machine's available RAM too (planning.memory_estimate),
    so nothing huge is ever allocated."""
    cfg = make_config(model, **{k: v for k, v in (model_overrides or {}).items() if v is not None})
    plan, cfg = plan_for_model(preset_fields(preset, **fields), cfg)
    check_slow(plan)
    check_fits(plan, cfg, plan_for_model)
    return plan, cfg


def check_backward(plan: Plan, backward: str) -> None:
    """The autograd backward is an oracle for one replica: refuse it where the forward communicates."""
    if backward not in BACKWARDS:
        raise PlanError(f"unknown backward={backward}: pick {' or '.join(BACKWARDS)}")
    dims = [f"{d}={getattr(plan, d)}" for d in NAMED_DIMS  # dp and tp regions are autograd-aware
            if d not in ("dp", "tp") and getattr(plan, d) > 1] + [f"{f}=True" for f in ("overlap", "fb_overlap") if getattr(plan, f)]
    if backward == "autograd" and dims:
        raise PlanError(f"backward=autograd is the oracle for one replica's forward; with {' '.join(dims)} "
                        f"the forward itself communicates, which autograd cannot see: drop "
                        f"backward=autograd (or those dims)")


REFERENCES = ("hand", "autograd")


def check_reference(plan: Plan, cfg, reference: str) -> None:
    """What `--check` can hold a plan to: hand (the plans' own layers in one process) or autograd
    (torch's modules, autograd and torch.optim, dense or MoE: kernels.torch_reference), fp32 only.
    bf16 is held to a multiple of the reference's own bf16 rounding (partui.world.checker); torch's
    modules round less than partui's kernels (fp32 inside SDPA, RMSNorm and the softmax on CPU),
    so in units of a bf16 torch model's own rounding a correct plan measured 6.1x to 8.7x (world
    1, tp 2 + sp, dp 2 zero 2, pp 2; the bound is 4.5x), and borrowing the hand model's rounding
    would tie the autograd reference back to the kernels it is meant to check. And in bf16 the
    two models would part on near-tie expert choices, which are compared exactly."""
    if reference not in REFERENCES:
        raise PlanError(f"unknown reference={reference}: pick hand or autograd")
    if reference == "autograd" and plan.dtype != "fp32":
        raise PlanError(f"reference=autograd runs fp32 (its bf16 rounding is not the plan's, which "
                        f"the bf16 bound is measured in), the plan has dtype={plan.dtype}: drop "
                        f"reference=autograd or set dtype=fp32")
