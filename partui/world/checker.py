"""`--check`: each step of a world held to the single-process reference (kernels.check), with the
tolerances in one place. The ranks report their grad and param pieces; `check_step` fills the step
line with the errors and says whether the step failed."""
from __future__ import annotations

import math

import torch

from kernels.check import Reference, assemble, compare_pieces
from kernels.checkpoint.reference import load_reference
from kernels.torch_reference import TorchReference
from partui.world.plans import check_reference

# fp32: max abs error of any element (both sides round the same math in fp32)
LOSS_ATOL = {"fp32": 2e-5, "bf16": 3e-2}   # bf16 loss: one ulp at loss ~5 is 0.03
GRAD_ATOL = {"fp32": 2e-5}
# fp32, each tensor: ||plan - reference|| / ||reference|| over one rank's pieces of it. An absolute
# bound alone lets a 1e-4 relative error through wherever a tensor's grads are small; correct plans
# measured <= 5.6e-7 against the autograd reference (tp 2 + sp, zero 1, zb1p, zigzag, ep 2 GShard
# and DeepSeek, ep overlap, dualpipev, dp 2 x tp 2 x pp 2; 3 steps each), so 1e-5 leaves them 18x
# room and catches a 1e-4 error in any one tensor at its first step.
GRAD_RTOL = {"fp32": 1e-5}
PARAM_ATOL = {"fp32": 1e-6}  # after the update, both sides stepping from the same grads
ATOL = {"grad": GRAD_ATOL, "param": PARAM_ATOL}
# bf16: an absolute bound cannot work (most grads and AdamW's per-step move are below bf16's ulp at
# the loss), so each tensor is held to what bf16 itself does to it at this step: the reference's own
# rounding (bf16 minus fp32 at the same params, Reference.rounding_noise), which carries bf16's
# epsilon through that tensor's real reductions. Correct splits measured <= 3.3x it (tp 2 + sp, 10
# steps; tp 2 x dp 2: 2.8x); a 1% error in TP's backward all-reduce 6.3x to 9.4x.
BF16_NOISE_RATIO = 4.5
BF16_PARAM_RTOL = 2.0 ** -7  # params: one bf16 eps relative (both sides step from the same grads)
ROUTING_ATOL = 1e-6   # bias (fp32 sums of +-gamma) and balance loss (summed in another order)


class Checker:
    """The reference a plan is held to (the whole model in one process, the hand backward, the plan's
    dtype: bf16 params, fp32 master weights and optimizer state), stepped with the world."""

    def __init__(self, plan, cfg, seed: int = 0, optim: str = "adamw", lr=None, weight_decay=None,
                 reference: str = "hand"):
        check_reference(plan, cfg, reference)
        dtype = torch.bfloat16 if plan.dtype == "bf16" else torch.float32
        self.reference = (TorchReference(plan, cfg, seed, optim, lr, weight_decay)
                          if reference == "autograd" else
                          Reference(plan, cfg, seed, optim, lr, weight_decay, "hand", dtype=dtype))
        self.dtype = plan.dtype

    def load(self, path: str) -> int:
        """The reference resumed from the checkpoint the world loaded (its step)."""
        if not isinstance(self.reference, Reference):
            raise ValueError("--reference autograd cannot resume from a checkpoint: drop "
                             "--reference autograd (the hand reference resumes)")
        return load_reference(self.reference, path)

    def step(self, items: list[dict], line: dict) -> bool:
        """The next step of the world (its ranks' items, its step line); True when it failed."""
        return check_step(self.reference, items, line, self.dtype)


def check_step(ref: Reference, items: list[dict], line: dict, dtype: str) -> bool:
    """One step against the reference, at the plan's own params: loss and grads, then the params
    after both sides update from the plan's grads. Takes the pieces out of `items` (one per rank),
    fills `line` (ref_loss, max_abs_*_err, max_rel_*_err, missing_*, check when it failed); True
    when it failed. A NaN or inf in the loss, a grad or a param fails, whatever the tolerance."""
    grad_pieces = [it.pop("grad_pieces") for it in items]
    param_pieces = [it.pop("param_pieces") for it in items]
    ref_loss, ref_grads = ref.forward_backward()
    noise = ref.rounding_noise(ref_grads) if dtype == "bf16" else None
    grads = compare_pieces(grad_pieces, ref_grads, noise)
    params = compare_pieces(param_pieces, ref.update(assemble(grad_pieces, ref_grads)))
    line["ref_loss"] = ref_loss
    loss_err = abs(line["loss"] - ref_loss)
    line["max_abs_loss_err"] = loss_err if math.isfinite(loss_err) else math.inf
    bad = [] if line["max_abs_loss_err"] <= LOSS_ATOL[dtype] else \
        [f"loss {line['loss']:.6g} vs reference {ref_loss:.6g}: error {loss_err:.2e} > "
         f"{LOSS_ATOL[dtype]:g}"]
    for what, cmp in (("grad", grads), ("param", params)):
        line[f"max_abs_{what}_err"] = cmp["max_abs_err"]
        line[f"max_rel_{what}_err"] = cmp["max_rel_err"]
        if cmp["nonfinite"]:
            bad.append(f"{what} not finite (NaN or inf) in {', '.join(cmp['nonfinite'][:3])}")
        elif dtype == "bf16" and what == "grad":
            line["grad_noise_ratio"] = cmp["max_noise_ratio"]
            if not cmp["max_noise_ratio"] <= BF16_NOISE_RATIO:
                bad.append(f"grad error {cmp['max_noise_ratio']:.1f}x bf16's own rounding > "
                           f"{BF16_NOISE_RATIO:g}x at {cmp['worst_noise']}")
        elif dtype == "bf16":
            if not cmp["max_rel_err"] <= BF16_PARAM_RTOL:
                bad.append(f"param relative error {cmp['max_rel_err']:.2e} > {BF16_PARAM_RTOL:.3g} "
                           f"at {cmp['worst_rel']}")
        elif not cmp["max_abs_err"] <= ATOL[what][dtype]:
            bad.append(f"{what} {cmp['max_abs_err']:.2e} > {ATOL[what][dtype]:g} at {cmp['worst']}")
        elif what == "grad" and not cmp["max_rel_err"] <= GRAD_RTOL[dtype]:
            bad.append(f"grad relative error {cmp['max_rel_err']:.2e} > {GRAD_RTOL[dtype]:g} at "
                       f"{cmp['worst_rel']}")
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
