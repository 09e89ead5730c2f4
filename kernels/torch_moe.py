"""The autograd reference's MoE block (kernels/torch_reference.py): GShard and DeepSeek-V3 routing
written from their definitions (../shared/REFERENCES.md) in plain torch, differentiated by autograd.
It imports nothing of kernels/ep: it shares only the initial weights and the data with partui.

Every expert runs on every token and a gate matrix G [T, E] combines them,
    y_t = sum_e G[t, e] * SwiGLU_e(x_t)   (+ the shared experts, DeepSeek)
G holds a choice's combine weight where the token chose e and the choice found a slot, else 0, so
an unchosen or dropped pair adds an exact zero to the output and to every grad (a dropped token
keeps only the residual). No rows, no dispatch: nothing here resembles the hand layer's layout.

GShard:   p = softmax(x Wr^T); the k best experts; weights renormalised over the k (k = 1 keeps
          the raw probability); capacity ceil(C * gs * k / E) slots per expert per routing group,
          filled in priority order (every token's 1st choice in token order, then every 2nd ...),
          the rest dropped; aux = coef * E * sum_e f_e P_e per group (f: fraction of the group's
          top-1 choices, before drops; P: mean probability), averaged over groups.
DeepSeek: s = sigmoid(x Wr^T); selection by s + b (b: per-expert bias, no grad, never a weight);
          with G route groups, a token keeps the M groups with the largest sum of their top-2
          biased scores and picks its k inside them; gates s[idx] / sum s[idx] x route_scale;
          shared experts always on; aux = alpha * sum_i f_i P_i per sequence, f_i = E / (k T) x
          tokens choosing i, P_i = mean_t s_ti / sum_j s_tj; dropless, or capacity as above.
          The bias is state: after each step b_i -= gamma * sign(load_i - mean load), load the
          step's choices per expert (before drops), computed here from this model's own routing.

Ties: selections use torch.topk (sorted, last dim), as the hand layers do. For exactly equal scores
its CPU order is implementation-defined (ones(4) top-2 gives experts [2, 3]) but a deterministic
function of the score vector, so bit-equal scores select alike in both. Scores equal only to
rounding can part; --check then reports the layer's routing counts as different.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    """The dense MLP, and DeepSeek's shared experts."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Stacked(nn.Module):
    """One weight per expert, stacked on dim 0 (partui's layout, so the names and shapes match)."""

    def __init__(self, *shape: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(shape))


class Experts(nn.Module):
    def __init__(self, e: int, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w3, self.w2 = Stacked(e, hidden, dim), Stacked(e, hidden, dim), \
            Stacked(e, dim, hidden)

    def forward(self, x):                                      # x [T, dim] -> [T, E, dim]
        h1 = torch.einsum("td,ehd->teh", x, self.w1.weight)    # [T, E, hidden]
        h3 = torch.einsum("td,ehd->teh", x, self.w3.weight)
        return torch.einsum("teh,edh->ted", F.silu(h1) * h3, self.w2.weight)


def within_capacity(idx: torch.Tensor, gs: int, cap: int | None, e: int) -> torch.Tensor:
    """keep [T, K] bool: the choice found a slot. Per routing group of gs tokens, slots are handed
    out in priority order, all 1st choices in token order, then all 2nd ...; a choice over `cap`
    is dropped (and still takes its place in the count). cap None: every choice kept."""
    t, k = idx.shape
    if cap is None:
        return torch.ones(t, k, dtype=torch.bool)
    chosen, keep = idx.tolist(), [[False] * k for _ in range(t)]
    for start in range(0, t, gs):
        used = [0] * e
        for j in range(k):
            for tok in range(start, start + gs):
                ex = chosen[tok][j]
                keep[tok][j] = used[ex] < cap
                used[ex] += 1
    return torch.tensor(keep, dtype=torch.bool)


class MoEBlock(nn.Module):
    """The MoE MLP of one block (GShard or DeepSeek-V3 by cfg.moe); `last` holds the step's
    routing counts (what the routing observatory reports) and its balance loss."""

    def __init__(self, cfg, index: int):
        super().__init__()
        self.cfg, self.index = cfg, index
        e, h = cfg.experts, cfg.expert_hidden
        self.router = nn.Linear(cfg.dim, e, bias=False)
        self.experts = Experts(e, cfg.dim, h)
        self.deepseek = cfg.moe == "deepseek"
        self.shared = (SwiGLU(cfg.dim, cfg.shared_experts * h)   # N shared: one N times wider
                       if self.deepseek and cfg.shared_experts else None)
        self.register_buffer("bias", torch.zeros(e), persistent=False)   # DeepSeek's, [E]
        self.gs = cfg.routing_group or cfg.seq
        self.cap = (None if cfg.capacity_factor is None else
                    math.ceil(cfg.capacity_factor * self.gs * cfg.top_k / e))
        self.last: dict = {}

    def forward(self, x):                                      # x [B, S, dim]
        b, s, d = x.shape
        xt = x.reshape(b * s, d)                               # [T, dim], groups consecutive
        logits = self.router(xt)                               # [T, E]
        gates, idx, aux = (self.deepseek_gates if self.deepseek else self.gshard_gates)(logits)
        y = (gates.unsqueeze(-1) * self.experts(xt)).sum(1)    # [T, dim]
        if self.shared is not None:
            y = y + self.shared(xt)
        e = self.cfg.experts
        self.last = {"chosen": torch.bincount(idx.reshape(-1), minlength=e),
                     "kept": torch.bincount(idx[self.kept].reshape(-1), minlength=e),
                     "aux": aux, "bias": self.bias.clone() if self.deepseek else None}
        return y.view(b, s, d)

    def gate_matrix(self, idx, w):
        """G [T, E]: each kept choice's weight at its expert, zero elsewhere."""
        self.kept = within_capacity(idx, self.gs, self.cap, self.cfg.experts)
        return torch.zeros(idx.shape[0], self.cfg.experts).scatter(1, idx, w * self.kept)

    def gshard_gates(self, logits):
        cfg, e = self.cfg, self.cfg.experts
        p = torch.softmax(logits, dim=-1)                      # [T, E]
        top, idx = p.topk(cfg.top_k, dim=-1)                   # [T, K] best first
        w = top / top.sum(-1, keepdim=True) if cfg.top_k > 1 else top
        groups = p.shape[0] // self.gs
        frac = F.one_hot(idx[:, 0], e).float().view(groups, self.gs, e).mean(1)    # [G, E]
        mean_p = p.view(groups, self.gs, e).mean(1)            # [G, E]
        aux = cfg.aux_loss_coef * e * (frac * mean_p).sum(-1).mean()
        return self.gate_matrix(idx, w), idx, aux

    def deepseek_gates(self, logits):
        cfg, e, k = self.cfg, self.cfg.experts, self.cfg.top_k
        s = torch.sigmoid(logits)                              # [T, E] affinities
        score = s.detach() + self.bias                         # selection only
        if cfg.route_groups > 1:
            per = e // cfg.route_groups
            by_group = score.view(-1, cfg.route_groups, per)   # [T, G, E/G]
            group_score = by_group.topk(min(2, per), dim=-1).values.sum(-1)     # [T, G]
            best = group_score.topk(cfg.route_topk_groups, dim=-1).indices      # [T, M]
            allowed = torch.zeros_like(group_score, dtype=torch.bool).scatter(1, best, True)
            score = score.masked_fill(~allowed.repeat_interleave(per, dim=1), -math.inf)
        idx = score.topk(k, dim=-1).indices                    # [T, K]
        top = s.gather(1, idx)
        w = top / top.sum(-1, keepdim=True) * cfg.route_scale
        seqs = s.shape[0] // self.gs
        f = F.one_hot(idx, e).sum(1).float().view(seqs, self.gs, e).sum(1) * (e / (k * self.gs))
        share = (s / s.sum(-1, keepdim=True)).view(seqs, self.gs, e).mean(1)    # [G, E] P_i
        aux = cfg.seq_aux_alpha * (f * share).sum(-1).mean()
        return self.gate_matrix(idx, w), idx, aux

    @torch.no_grad()
    def balance(self) -> None:
        """DeepSeek's auxiliary-loss-free step from this step's own load (choices per expert)."""
        if self.deepseek and self.cfg.balance == "bias" and self.last:
            load = self.last["chosen"].float()
            self.bias -= self.cfg.bias_gamma * torch.sign(load - load.mean())

    def figures(self) -> dict:
        """The step's routing counts, in the routing observatory's keys that --check compares."""
        last = self.last
        return {"tokens_per_expert": last["kept"].tolist(),
                "chosen_per_expert": last["chosen"].tolist(),
                "dropped": int(last["chosen"].sum() - last["kept"].sum()),
                "balance_loss": float(last["aux"].detach()),
                "bias": None if last["bias"] is None else last["bias"].tolist()}
