"""What an MoE layer keeps for backward, per microbatch, listed from what the hand-written layer saves
(kernels/ep/layer.py, kernels/ep/routing.py, kernels/ep/deepseek.py), so `partui plan` predicts MoE
memory as it does a dense block's.

For T tokens, E experts, top-k K, dim d, expert hidden H, N rows this rank sends to the experts and
M rows its own experts receive (element size e: the plan's dtype):

    routing   e (2 T E + T K [+ T K] + 1) + 8 (2 T K) + T K    probs and f_tok [T, E]; the choices'
              router values, and the combine weights where they are not those values (top-1 GShard
              keeps the raw probability); the balance loss; the experts chosen and their slots
              (int64); which choices were kept (bool)
    rows      8 (2 N) + e N + 8 E [+ 8 E]                      each row's token and choice, its
              validity, rows per expert [and the counts received, when counts are exchanged]
    experts   8 (2 M) + e (M d + 5 M H)                        the arrival-order permutation and its
              inverse; the rows grouped by expert, and SwiGLU's h1, h3, sig, act and w2's input
    returned  e N d                                            the experts' outputs back in send order
    shared    e 5 T Hs                                         DeepSeek's shared experts (Hs = their
                                                               count x H), on the same input

The routing's input (the norm's output) is counted with the attention's (planning/memory_estimate).

N and M: an even dispatch (GShard's capacity-padded buffers) sends E x G x capacity rows from
every rank and so receives as many: exact. An uneven dispatch sends the kept choices, T K where no
capacity drops any, and receives whatever the routing sends it: M is the routing's, and a
prediction takes M = N, the balanced case (`routing_dependent` says when that is an assumption).
Counts are exchanged (an extra [E] int64) where the dispatch is uneven and the ep group has more
than one rank, or its counts are sent early (the EP overlap runner, F&B pairs).
"""
from __future__ import annotations

import math

INT64, BOOL = 8, 1


def routing_groups(cfg, tokens: int) -> tuple[int, int]:
    """(groups G, tokens per group gs): a group is routing_group tokens, or one sequence."""
    gs = cfg.routing_group or cfg.seq
    return tokens // gs, gs


def capacity(cfg, gs: int) -> int | None:
    """Slots per expert per routing group, as kernels/ep/routing.capacity; None: no limit."""
    if cfg.capacity_factor is None:
        return None
    return math.ceil(cfg.capacity_factor * gs * cfg.top_k / cfg.experts)


def sent_rows(cfg, plan, tokens: int) -> int:
    """Rows a rank sends for `tokens` tokens: even, E x G x capacity (a group's every token where no
    capacity is set); uneven, T K, every choice (an upper bound where a capacity drops some)."""
    if plan.ep_dispatch == "even":
        g, gs = routing_groups(cfg, tokens)
        cap = capacity(cfg, gs)
        return cfg.experts * g * (gs if cap is None else cap)
    return tokens * cfg.top_k


def routing_dependent(cfg, plan) -> bool:
    """Whether an MoE layer's saved bytes depend on the routing: an uneven dispatch over more than
    one rank receives what the router sends it (and a capacity drops what it drops)."""
    return plan.ep_dispatch == "uneven" and (plan.ep > 1 or cfg.capacity_factor is not None)


def counts_exchanged(plan) -> bool:
    return plan.ep_dispatch == "uneven" and (plan.ep > 1 or plan.overlap or plan.fb_overlap)


def moe_mlp_bytes(cfg, plan, tokens: int, elem: int, sent: int | None = None,
                  received: int | None = None) -> int:
    """Bytes an MoE layer saves for `tokens` tokens (the module docstring), N = `sent` and M =
    `received` rows (default: `sent_rows`, and M = N)."""
    t, e, k, d, h = tokens, cfg.experts, cfg.top_k, cfg.dim, cfg.expert_hidden
    n = sent_rows(cfg, plan, tokens) if sent is None else sent
    m = n if received is None else received
    separate_weights = cfg.moe == "deepseek" or k > 1     # top-1 GShard: the weight is the value
    routing = elem * (2 * t * e + t * k * (1 + separate_weights) + 1) + INT64 * 2 * t * k + BOOL * t * k
    rows = INT64 * 2 * n + elem * n + INT64 * e * (1 + counts_exchanged(plan))
    experts = INT64 * 2 * m + elem * (m * d + 5 * m * h)
    shared = elem * 5 * t * cfg.shared_experts * h if cfg.moe == "deepseek" else 0
    return routing + rows + experts + elem * n * d + shared
