"""GShard gating and the expert math of a Mixture-of-Experts layer, forward and hand backward.

    logits = x Wr^T                       router, Wr [E, dim]
    probs  = softmax(logits)              [T, E]
    top-k  = the k best experts; weights renormalised over the k (top-1 keeps its raw probability,
             as Switch does, so the router still learns from the main loss)
    slots  = per routing group and expert, top-1 choices of every token first, then top-2 ...;
             a choice whose slot >= capacity ceil(C * group_tokens * K / E) is dropped
    aux    = coef * E * sum_e f_e * P_e per routing group (f: fraction of top-1 choices, P: mean
             router probability), averaged over every group of the GLOBAL batch, so the partial aux
             losses of every rank and microbatch add up to the reference's

Everything here is plain tensor math on one rank's tokens; kernels/ep/layer.py moves rows between
ranks.
The forward uses only differentiable torch ops, so autograd can check the hand backward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.layers.base import Ctx


def group_tokens(cfg) -> int:
    """Tokens per routing group; a group never spans two sequences (dp / microbatch cut rows)."""
    gs = cfg.routing_group or cfg.seq
    if gs < 1 or cfg.seq % gs:
        raise ValueError(f"routing group {cfg.routing_group} must divide seq {cfg.seq} so no group "
                         f"spans two sequences: pick a divisor of {cfg.seq} (0 = one sequence)")
    return gs


def capacity(cfg, gs: int) -> int | None:
    """Slots per expert per routing group; None when the capacity factor is None (no limit)."""
    if cfg.capacity_factor is None:
        return None
    if cfg.capacity_factor <= 0:
        raise ValueError(f"capacity factor {cfg.capacity_factor} must be > 0 (None: no limit)")
    return math.ceil(cfg.capacity_factor * gs * cfg.top_k / cfg.experts)


@dataclass
class Routing:
    probs: torch.Tensor     # [T, E]
    idx: torch.Tensor       # [T, K] expert of each choice, best first
    topv: torch.Tensor      # [T, K] router probability of each choice
    w: torch.Tensor         # [T, K] combine weight (renormalised); dropped choices still listed
    keep: torch.Tensor      # [T, K] bool: the choice got a slot
    pos: torch.Tensor       # [T, K] its slot inside (group, expert)
    f_tok: torch.Tensor     # [T, E] fraction of the token's group whose top-1 is e (no grad)
    aux_scale: float        # d aux / d (f_tok * probs).sum()
    aux: torch.Tensor       # 0-dim partial aux loss


def route(logits: torch.Tensor, cfg, gs: int, global_groups: int) -> Routing:
    """GShard top-k gating of T = G * gs tokens; logits [T, E]."""
    t, e = logits.shape
    k = cfg.top_k
    g = t // gs
    probs = torch.softmax(logits, dim=-1)                            # [T, E]
    topv, idx = probs.topk(k, dim=-1)                                # [T, K], sorted best first
    w = topv / topv.sum(-1, keepdim=True) if k > 1 else topv
    onehot = torch.nn.functional.one_hot(idx, e)                     # [T, K, E] int64
    pos, keep = slots(onehot, gs, capacity(cfg, gs))
    f = onehot[:, 0].view(g, gs, e).to(probs.dtype).mean(1)          # [G, E]
    f_tok = f.repeat_interleave(gs, dim=0)                           # [T, E]
    aux_scale = cfg.aux_loss_coef * e / (global_groups * gs)
    aux = aux_scale * (f_tok * probs).sum()
    return Routing(probs, idx, topv, w, keep, pos, f_tok, aux_scale, aux)


def slots(onehot: torch.Tensor, gs: int, cap: int | None):
    """(pos, keep) [T, K]: each choice's slot inside (routing group, expert), and whether it is
    under the capacity (None: every choice kept). onehot [T, K, E] of the chosen experts."""
    t, k, e = onehot.shape
    g = t // gs
    # priority order inside a group: every token's 1st choice, then every token's 2nd ...
    prio = onehot.view(g, gs, k, e).transpose(1, 2).reshape(g, k * gs, e)  # [G, K*gs, E]
    slot = ((prio.cumsum(1) - 1) * prio).sum(-1)                     # [G, K*gs]
    pos = slot.view(g, k, gs).transpose(1, 2).reshape(t, k)          # [T, K]
    keep = pos < cap if cap is not None else torch.ones_like(pos, dtype=torch.bool)
    return pos, keep


def gate_backward(r: Routing, dw: torch.Tensor, top_k: int) -> torch.Tensor:
    """dlogits [T, E] from dw [T, K] (grad of the combine weights) plus the aux loss (dloss = 1)."""
    if top_k > 1:   # w = v / sum(v): dv_i = (dw_i - sum_j dw_j w_j) / sum(v)
        dv = (dw - (dw * r.w).sum(-1, keepdim=True)) / r.topv.sum(-1, keepdim=True)
    else:
        dv = dw
    dprobs = r.f_tok * r.aux_scale                                   # [T, E]
    dprobs = dprobs.scatter_add(1, r.idx, dv)
    return r.probs * (dprobs - (dprobs * r.probs).sum(-1, keepdim=True))   # softmax backward


# ---------------------------------------------------------------- rows sent to the experts

@dataclass
class Rows:
    """One row per (token, choice) sent to an expert, grouped by global expert id."""
    src: torch.Tensor       # [N] token of the row
    arow: torch.Tensor      # [N] flat (token, choice) index t * K + k
    valid: torch.Tensor     # [N] 1.0 for a real row, 0.0 for capacity padding (x dtype)
    counts: torch.Tensor    # [E] rows per expert (padding included)


def uneven_rows(r: Routing, dtype) -> Rows:
    """Only kept choices, sorted by expert: each expert receives exactly its tokens."""
    e = r.probs.shape[1]
    a = r.keep.reshape(-1).nonzero().squeeze(1)                      # kept (token, choice)
    ex = r.idx.reshape(-1)[a]                                        # [kept] expert of each
    order = torch.sort(ex, stable=True).indices
    a, ex = a[order], ex[order]
    k = r.idx.shape[1]
    return Rows(a // k, a, torch.ones(a.numel(), dtype=dtype, device=a.device),
                torch.bincount(ex, minlength=e))


def even_rows(r: Routing, gs: int, cap: int | None, dtype) -> Rows:
    """GShard's capacity-padded layout: every expert gets G * cap slots, empty ones zero."""
    t, e = r.probs.shape
    k = r.idx.shape[1]
    cap = cap if cap is not None else gs    # no limit: one expert gets at most every token once
    per_expert = (t // gs) * cap
    a = r.keep.reshape(-1).nonzero().squeeze(1)                      # kept (token, choice)
    tok = a // k
    slot = r.idx.reshape(-1)[a] * per_expert + (tok // gs) * cap + r.pos.reshape(-1)[a]  # [kept]
    n = e * per_expert
    src = a.new_zeros(n).index_copy(0, slot, tok)
    arow = a.new_zeros(n).index_copy(0, slot, a)
    ones = r.probs.new_ones(a.numel(), dtype=dtype)
    valid = r.probs.new_zeros(n, dtype=dtype).index_copy(0, slot, ones)
    return Rows(src, arow, valid, a.new_full((e,), per_expert))


def gather_rows(xt: torch.Tensor, rows: Rows) -> torch.Tensor:
    return xt.index_select(0, rows.src) * rows.valid[:, None]       # [N, dim]


def combine(ret: torch.Tensor, rows: Rows, r: Routing, t: int) -> torch.Tensor:
    """out[t] = sum over kept choices of w * expert output; dropped tokens get zero."""
    wrow = r.w.reshape(-1).index_select(0, rows.arow) * rows.valid   # [N]
    out = ret.new_zeros(t, ret.shape[1])
    return out.index_add(0, rows.src, ret * wrow[:, None])           # [T, dim]


def combine_backward(dy: torch.Tensor, ret: torch.Tensor, rows: Rows, r: Routing):
    """(d expert outputs [N, dim], dw [T, K]) from dy [T, dim]."""
    g = dy.index_select(0, rows.src)                                 # [N, dim]
    wrow = r.w.reshape(-1).index_select(0, rows.arow) * rows.valid   # [N]
    dwrow = (g * ret).sum(-1) * rows.valid                           # [N]
    dw = dy.new_zeros(r.w.numel()).index_add(0, rows.arow, dwrow)
    return g * wrow[:, None], dw.view_as(r.w)                        # [N, dim], [T, K]


def scatter_rows(drows: torch.Tensor, rows: Rows, t: int) -> torch.Tensor:
    """Backward of gather_rows: dx [T, dim]."""
    out = drows.new_zeros(t, drows.shape[1])
    return out.index_add(0, rows.src, drows * rows.valid[:, None])


# ---------------------------------------------------------------- SwiGLU experts on grouped rows

def experts_forward(w1, w3, w2, x: torch.Tensor, counts: list[int]):
    """Rows grouped by local expert (counts[l] rows each) through SwiGLU expert l.

    w1, w3 [El, hidden, dim], w2 [El, dim, hidden], x [M, dim] -> y [M, dim]. Same math as
    kernels/layers/mlp.py, one expert's weights per chunk of rows."""
    ys, saved = [], []
    for l, xc in enumerate(x.split(counts)):
        h1 = xc @ w1[l].t()                       # [n_l, hidden]
        h3 = xc @ w3[l].t()
        sig = torch.sigmoid(h1)
        act = h1 * sig                            # silu
        hid = act * h3
        ys.append(hid @ w2[l].t())                # [n_l, dim]
        saved.append(Ctx(x=xc, h1=h1, h3=h3, sig=sig, act=act, hid=hid))
    return torch.cat(ys) if ys else x.new_zeros(0, x.shape[1]), Ctx(per=saved, counts=counts)


def experts_backward_input(w1, w3, w2, ctx, dy: torch.Tensor) -> torch.Tensor:
    """dx [M, dim] from dy [M, dim]; keeps what the weight grads need."""
    dxs = []
    for l, (c, dyc) in enumerate(zip(ctx.per, dy.split(ctx.counts))):
        da = dyc @ w2[l]                          # [n_l, hidden]
        dsilu = c.sig * (1 + c.h1 * (1 - c.sig))
        c.dh1, c.dh3, c.dy = da * c.h3 * dsilu, da * c.act, dyc
        c.h1 = c.h3 = c.sig = c.act = None
        dxs.append(c.dh1 @ w1[l] + c.dh3 @ w3[l])
    return torch.cat(dxs) if dxs else dy.new_zeros(0, dy.shape[1])


def experts_backward_weight(ctx, like1, like3, like2):
    """(dW1, dW3, dW2) stacked over local experts; experts without rows get zeros."""
    d1, d3, d2 = torch.zeros_like(like1), torch.zeros_like(like3), torch.zeros_like(like2)
    for l, c in enumerate(ctx.per):
        d1[l] = c.dh1.t() @ c.x                   # [hidden, dim]
        d3[l] = c.dh3.t() @ c.x
        d2[l] = c.dy.t() @ c.hid                  # [dim, hidden]
    ctx.per = None
    return d1, d3, d2
