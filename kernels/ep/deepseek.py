"""DeepSeek-V3's routing (technical report, section 2.1.2), forward and hand backward, on one rank's
tokens; scaled down, the same formulas.

    s      = sigmoid(u . e_i)                   affinities [T, E], router Wr [E, dim]
    groups = (G = route_groups) groups of E / G experts; a group scores the sum of its top-2
             biased affinities s + b; each token keeps its best M = route_topk_groups groups
    idx    = top-k of s + b inside the kept groups     (b: per-expert bias, selection only)
    w      = route_scale * s[idx] / sum s[idx]         gate values: from s, never from b
    aux    = alpha * sum_i f_i P_i per sequence (the complementary sequence-wise balance loss),
             f_i = E / (K T) * #tokens choosing i,  P_i = mean_t s_ti / sum_j s_tj,
             averaged over every sequence (routing group) of the GLOBAL batch
    balance: after each step b_i -= gamma if expert i took more than the mean load, += if less

Dispatch is dropless (capacity_factor None) as DeepSeek trains, or GShard's capacity mode with the
same slot priority (kernels/ep/routing.slots). The routed-expert math, rows, dispatch and combine
are GShard's (kernels/ep/routing.py); the shared experts are one SwiGLU shared_experts times wider.
`route_deepseek` uses only differentiable torch ops past the selection, so autograd checks
`gate_backward_deepseek`, and an independent implementation can be written against the same weights
from the formulas above.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.ep.routing import capacity, slots


@dataclass
class DeepSeekRouting:
    """The fields the rows / combine code reads (probs, idx, w, keep, pos) and the backward's."""
    probs: torch.Tensor     # [T, E] affinities s = sigmoid(logits)
    idx: torch.Tensor       # [T, K] chosen experts, best biased score first
    topv: torch.Tensor      # [T, K] affinity of each choice (unbiased)
    w: torch.Tensor         # [T, K] gate values: topv / sum(topv) * route_scale
    keep: torch.Tensor      # [T, K] bool: the choice got a slot (always, dropless)
    pos: torch.Tensor       # [T, K] its slot inside (group, expert)
    f_tok: torch.Tensor     # [T, E] f_i of the token's sequence (no grad)
    aux_scale: float        # d aux / d (f_tok * normalised affinities).sum()
    aux: torch.Tensor       # 0-dim partial sequence-wise balance loss
    route_scale: float


def select(scores: torch.Tensor, bias: torch.Tensor, top_k: int, groups: int,
           topk_groups: int) -> torch.Tensor:
    """idx [T, K]: group-limited top-k of the biased scores s + b (no grad: selection only)."""
    t, e = scores.shape
    biased = scores.detach().float() + bias.float()                  # [T, E]
    if groups > 1:
        per = e // groups
        grouped = biased.view(t, groups, per)                        # [T, G, E/G]
        group_score = grouped.topk(min(2, per), dim=-1).values.sum(-1)   # [T, G]
        best = group_score.topk(topk_groups, dim=-1).indices         # [T, M]
        allowed = torch.zeros(t, groups, dtype=torch.bool, device=scores.device)
        allowed.scatter_(1, best, True)
        biased = biased.masked_fill(~allowed.repeat_interleave(per, dim=1), float("-inf"))
    return biased.topk(top_k, dim=-1).indices                        # [T, K]


def route_deepseek(logits: torch.Tensor, bias: torch.Tensor, cfg, gs: int,
                   global_groups: int) -> DeepSeekRouting:
    """DeepSeek-V3 routing of T = G * gs tokens (gs: one sequence); logits [T, E], bias [E]."""
    t, e = logits.shape
    k, g = cfg.top_k, t // gs
    s = torch.sigmoid(logits)                                        # [T, E]
    idx = select(s, bias, k, cfg.route_groups, cfg.route_topk_groups)
    topv = s.gather(1, idx)                                          # [T, K]
    w = topv / topv.sum(-1, keepdim=True) * cfg.route_scale
    onehot = torch.nn.functional.one_hot(idx, e)                     # [T, K, E]
    pos, keep = slots(onehot, gs, capacity(cfg, gs))
    chose = onehot.sum(1).view(g, gs, e).to(s.dtype).sum(1)          # [G, E] tokens choosing i
    f = chose * (e / (k * gs))                                       # [G, E]
    f_tok = f.repeat_interleave(gs, dim=0)                           # [T, E]
    aux_scale = cfg.seq_aux_alpha / (gs * global_groups)
    aux = aux_scale * (f_tok * (s / s.sum(-1, keepdim=True))).sum()
    return DeepSeekRouting(s, idx, topv, w, keep, pos, f_tok, aux_scale, aux, cfg.route_scale)


def gate_backward_deepseek(r: DeepSeekRouting, dw: torch.Tensor) -> torch.Tensor:
    """dlogits [T, E] from dw [T, K] (grad of the gate values) plus the sequence loss (dloss = 1)."""
    s = r.probs
    wn = r.w / r.route_scale                                         # [T, K] normalised gates
    dwn = dw * r.route_scale
    dv = (dwn - (dwn * wn).sum(-1, keepdim=True)) / r.topv.sum(-1, keepdim=True)   # [T, K]
    ssum = s.sum(-1, keepdim=True)                                   # [T, 1]
    dnorm = r.f_tok * r.aux_scale                                    # d aux / d (s / sum s)
    ds = (dnorm - (dnorm * s).sum(-1, keepdim=True) / ssum) / ssum   # [T, E]
    ds = ds.scatter_add(1, r.idx, dv)
    return ds * s * (1 - s)                                          # sigmoid backward


def bias_step(bias: torch.Tensor, load: torch.Tensor, gamma: float) -> torch.Tensor:
    """Auxiliary-loss-free balancing: b_i - gamma * sign(load_i - mean load); load [E] tokens."""
    load = load.to(bias.dtype)
    return bias - gamma * torch.sign(load - load.mean())
