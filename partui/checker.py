"""`--check`: each step of a world held to the single-process reference (kernels.check), with the
tolerances in one place. The ranks report their grad and param pieces; `check_step` fills the step
line with the errors and says whether the step failed."""
from __future__ import annotations

import torch

from kernels.check import Reference, assemble, compare_pieces

# max abs error of any element, by the plan's dtype (bf16: one ulp at loss ~5 is 0.03)
LOSS_ATOL = {"fp32": 2e-5, "bf16": 3e-2}
GRAD_ATOL = {"fp32": 2e-5, "bf16": 3e-2}
PARAM_ATOL = {"fp32": 1e-6, "bf16": 3e-2}  # after the update, both sides stepping from the same grads
ROUTING_ATOL = 1e-6   # bias (fp32 sums of +-gamma) and balance loss (summed in another order)


class Checker:
    """The reference a plan is held to (the whole model in one process, the hand backward, the plan's
    dtype: bf16 params, fp32 master weights and optimizer state), stepped with the world."""

    def __init__(self, plan, cfg, seed: int = 0, optim: str = "adamw", lr=None, weight_decay=None):
        dtype = torch.bfloat16 if plan.dtype == "bf16" else torch.float32
        self.reference = Reference(plan, cfg, seed, optim, lr, weight_decay, "hand", dtype=dtype)
        self.dtype = plan.dtype

    def step(self, items: list[dict], line: dict) -> bool:
        """The next step of the world (its ranks' items, its step line); True when it failed."""
        return check_step(self.reference, items, line, self.dtype)


def check_step(ref: Reference, items: list[dict], line: dict, dtype: str) -> bool:
    """One step against the reference, at the plan's own params: loss and grads, then the params
    after both sides update from the plan's grads. Takes the pieces out of `items` (one per rank),
    fills `line` (ref_loss, max_abs_*_err, missing_*, check when it failed); True when it failed."""
    grad_pieces = [it.pop("grad_pieces") for it in items]
    param_pieces = [it.pop("param_pieces") for it in items]
    ref_loss, ref_grads = ref.forward_backward()
    grads = compare_pieces(grad_pieces, ref_grads)
    params = compare_pieces(param_pieces, ref.update(assemble(grad_pieces, ref_grads)))
    line["ref_loss"] = ref_loss
    line["max_abs_loss_err"] = abs(line["loss"] - ref_loss)
    line["max_abs_grad_err"] = grads["max_abs_err"]
    line["max_abs_param_err"] = params["max_abs_err"]
    bad = [f"loss {line['max_abs_loss_err']:.2e} > {LOSS_ATOL[dtype]:g}"] \
        if line["max_abs_loss_err"] > LOSS_ATOL[dtype] else []
    for what, cmp, tol in (("grad", grads, GRAD_ATOL[dtype]), ("param", params, PARAM_ATOL[dtype])):
        if cmp["max_abs_err"] > tol:
            bad.append(f"{what} {cmp['max_abs_err']:.2e} > {tol:g} at {cmp['worst']}")
        if cmp["missing"]:
            line[f"missing_{what}s"] = cmp["missing"]
            bad.append(f"no rank reports all of the {what}s of {', '.join(cmp['missing'][:3])}")
    bad += routing_mismatches(line.get("moe_layers", {}), ref.routing)
    if bad:
        line["check"] = "FAILED (" + "; ".join(bad) + ")"
    return bool(bad)


def routing_mismatches(got: dict, want: dict) -> list[str]:
    """The routing observatory against the reference's: the same layers, the same counts (exactly),
    the same bias and balance loss (fp32 rounding); one message per difference."""
    if set(got) != set(want):
        return [f"routing figures for MoE layers {sorted(got)} but the reference has {sorted(want)}"]
    bad = []
    for index, ref in want.items():
        fig = got[index]
        for key in ("tokens_per_expert", "chosen_per_expert", "dropped"):
            if fig[key] != ref[key]:
                bad.append(f"layer {index} {key} {fig[key]} != reference {ref[key]}")
        if abs(fig["balance_loss"] - ref["balance_loss"]) > ROUTING_ATOL:
            bad.append(f"layer {index} balance_loss {fig['balance_loss']:.6g} != reference "
                       f"{ref['balance_loss']:.6g}")
        if (fig["bias"] is None) != (ref["bias"] is None) or (
                ref["bias"] is not None
                and max(abs(a - b) for a, b in zip(fig["bias"], ref["bias"])) > ROUTING_ATOL):
            bad.append(f"layer {index} bias {fig['bias']} != reference {ref['bias']}")
    return bad
