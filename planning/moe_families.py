"""The MoE families and their routing fields, checked without torch (planning/mesh.py validates a
plan with them before any process starts).

    gshard    softmax gate, top-k, capacity and drops, the aux loss (kernels/ep/routing.py)
    deepseek  DeepSeek-V3: sigmoid affinities, top-k on affinity + bias (selection only), gates
              normalised x route_scale, group-limited routing, shared experts, bias balancing,
              the sequence-wise balance loss (kernels/ep/deepseek.py)
"""
from __future__ import annotations

MOE_FAMILIES = ("gshard", "deepseek")
BALANCE_MODES = ("none", "bias")
DEEPSEEK_ONLY = {"shared_experts": 0, "route_groups": 1, "route_topk_groups": 1,
                 "seq_aux_alpha": 0.0, "balance": "none"}


def routing_problem(cfg) -> str | None:
    """The first problem with an MoE model's routing fields (named as Plan fields), else None."""
    if cfg.moe not in MOE_FAMILIES:
        return f"unknown moe={cfg.moe}: pick {' or '.join(MOE_FAMILIES)}"
    if not cfg.experts:
        return (None if cfg.moe == "gshard" else
                f"moe={cfg.moe} routes tokens to experts, but the model has none: set experts=8 "
                f"(or --model deepseek-tiny)")
    if cfg.moe == "gshard":
        for name, off in DEEPSEEK_ONLY.items():
            if getattr(cfg, name) != off:
                return (f"{name}={getattr(cfg, name)} is DeepSeek routing, but moe=gshard: add "
                        f"moe=deepseek (or drop {name})")
        return None
    e, g, m = cfg.experts, cfg.route_groups, cfg.route_topk_groups
    if cfg.shared_experts < 0:
        return f"shared_experts={cfg.shared_experts} must be >= 0"
    if cfg.moe_hidden < 0:
        return f"moe_hidden={cfg.moe_hidden} must be >= 0 (0: the dense MLP's hidden size)"
    if cfg.route_scale <= 0:
        return f"route_scale={cfg.route_scale} must be > 0 (1: gates sum to 1)"
    if g < 1 or e % g:
        divs = ", ".join(str(d) for d in range(1, e + 1) if e % d == 0)
        return f"route_groups={g} must divide the {e} experts: pick route_groups in {divs}"
    if not 1 <= m <= g:
        return f"route_topk_groups={m} must be between 1 and route_groups={g}"
    if cfg.top_k > m * (e // g):
        return (f"top_k={cfg.top_k} is more than the {m * (e // g)} experts in route_topk_groups={m} "
                f"groups of {e // g}: raise route_topk_groups or lower top_k")
    if cfg.seq_aux_alpha < 0:
        return f"seq_aux_alpha={cfg.seq_aux_alpha} must be >= 0 (0: no sequence-wise loss)"
    if cfg.balance not in BALANCE_MODES:
        return f"unknown balance={cfg.balance}: pick {' or '.join(BALANCE_MODES)}"
    if cfg.bias_gamma < 0:
        return f"bias_gamma={cfg.bias_gamma} must be >= 0"
    return None
