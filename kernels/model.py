"""The tiny Llama built from hand-written layers, and the single-process reference step that every
plan is held to (its config, parameter shapes and init: planning/config.py).

The model is a flat list of stage layers: [Embed, Block 0 .. Block L-1, Head] (the Block and its
backward parts: kernels/block.py). Each has
forward(x) -> (y, ctx), backward_input(ctx, dy) -> dx, backward_weight(ctx); the Head takes the
targets and returns the loss. Pipeline stages are slices of this list.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernels.block import Block
from kernels.comm import events
from kernels.ep.build import build_moe
from kernels.layers import (Attention, CrossEntropy, Ctx, Embedding, Layer, Linear, LocalAttention, Param,
                            RMSNorm, SwiGLU, rope_tables)
from kernels.weights import init_params
from planning.config import ModelConfig, is_moe_layer

# ---------------------------------------------------------------- stage layers

class Embed(Layer):
    def __init__(self, emb: Embedding):
        self.emb = emb

    def sublayers(self):
        return {"embed": self.emb}

    def forward(self, ids):                    # ids [B, S]
        return self.emb.forward(ids)           # [B, S, dim]

    def backward_input(self, ctx, dy):
        return self.emb.backward_input(ctx, dy)

    def backward_weight(self, ctx):
        self.emb.backward_weight(ctx)


class Head(Layer):
    """Final norm, LM head and cross-entropy: (x, targets) -> partial loss."""

    def __init__(self, norm, lm_head, loss_fn):
        self.norm, self.lm_head, self.loss_fn = norm, lm_head, loss_fn

    def sublayers(self):
        return {"norm": self.norm, "lm_head": self.lm_head}

    def forward(self, x, targets, denom):                   # x [B, S, dim], targets [B, S]
        n, c_n = self.norm.forward(x)
        logits, c_l = self.lm_head.forward(n)               # [B, S, vocab]
        b, s, v = logits.shape
        flat_logits, flat_targets = logits.reshape(b * s, v), targets.reshape(-1)  # [B*S, vocab], [B*S]
        loss, c_ce = self.loss_fn.forward(flat_logits, flat_targets, denom)
        return loss, Ctx(c_n=c_n, c_l=c_l, c_ce=c_ce, shape=(b, s, v))

    def backward_input(self, ctx, dloss=1.0):
        dlogits = self.loss_fn.backward_input(ctx.c_ce, dloss).reshape(ctx.shape)  # [B, S, vocab]
        return self.norm.backward_input(ctx.c_n, self.lm_head.backward_input(ctx.c_l, dlogits))

    def backward_weight(self, ctx):
        self.lm_head.backward_weight(ctx.c_l)
        self.norm.backward_weight(ctx.c_n)


def whole_param(tensors: dict, name: str) -> Param:
    """The Param of the whole global tensor `name` (the single-process layout)."""
    return Param(name, tensors[name])


def build_block(cfg: ModelConfig, i: int, tensors: dict, cos, sin, positions, rank_ctx=None,
                stats=None) -> Block:
    """A dense (or MoE) block owning the whole of its tensors: the single-process layout."""
    pre = f"layers.{i}."

    def linear(name):
        return Linear(whole_param(tensors, pre + name))

    attn = Attention(linear("attn.wq.weight"), linear("attn.wk.weight"), linear("attn.wv.weight"),
                     linear("attn.wo.weight"), cfg.heads, cfg.kv_heads, cfg.head_dim, cos, sin,
                     LocalAttention(positions))
    if is_moe_layer(cfg, i):  # the MoE variant lives with expert parallelism
        mlp = build_moe(cfg, pre + "moe.", tensors, rank_ctx, stats=stats)
    else:
        mlp = SwiGLU(linear("mlp.w1.weight"), linear("mlp.w3.weight"), linear("mlp.w2.weight"))
    return Block(i, RMSNorm(whole_param(tensors, pre + "attn_norm.weight"), cfg.norm_eps), attn,
                 RMSNorm(whole_param(tensors, pre + "mlp_norm.weight"), cfg.norm_eps), mlp)


@dataclass
class Llama:
    """The stage layers in order; `params()` maps every global name to its Param."""
    cfg: ModelConfig
    layers: list = field(default_factory=list)  # [Embed, Block..., Head]

    def params(self) -> dict[str, Param]:
        return named_params(self.layers)

    def zero_grad(self) -> None:
        for prm in self.params().values():
            prm.zero_grad()


def _canonical(name: str, layer) -> str:
    if isinstance(layer, Block):
        return f"layers.{layer.index}.{name}"
    return name  # Embed gives embed.weight, Head gives norm.weight / lm_head.weight


def named_params(layers: list) -> dict[str, Param]:
    """Every Param of a list of stage layers under its global (canonical) name."""
    return {_canonical(name, layer): prm for layer in layers for name, prm in layer.params().items()}


class LayerHooks:
    """Called around each layer's forward and backward (ZeRO-3 gathers and frees here)."""

    def before_forward(self, layer): ...
    def after_forward(self, layer): ...
    def before_backward(self, layer): ...
    def after_backward(self, layer): ...


def build_model(cfg: ModelConfig, seed: int, dtype=torch.float32, tensors=None, rank_ctx=None,
                stats=None) -> Llama:
    """The whole model on one rank; `rank_ctx` (kernels.context.RankContext) lets MoE layers shard
    their experts over the ep group and record their routing into its stats; without one, MoE
    layers record into `stats` (kernels.stats.StepStats) when given."""
    tensors = tensors if tensors is not None else init_params(cfg, seed, dtype)
    positions = torch.arange(cfg.seq)
    cos, sin = rope_tables(positions, cfg.head_dim, cfg.rope_theta, dtype)
    layers = [Embed(Embedding(whole_param(tensors, "embed.weight")))]
    layers += [build_block(cfg, i, tensors, cos, sin, positions, rank_ctx, stats)
               for i in range(cfg.layers)]
    layers.append(Head(RMSNorm(whole_param(tensors, "norm.weight"), cfg.norm_eps),
                       Linear(whole_param(tensors, "lm_head.weight")), CrossEntropy()))
    return Llama(cfg, layers)


# ---------------------------------------------------------------- forward / backward over a layer list

def layer_span_name(layer) -> str:
    """A layer's name in trace spans: embed, block 3, head."""
    return {Embed: "embed", Head: "head"}.get(type(layer)) or f"block {getattr(layer, 'index', '?')}"


def forward_backward(layers: list, ids, targets, denom, backward: str = "hand", hooks=None,
                     memory=None):
    """Run the layers on one microbatch and accumulate grads; returns the (partial) loss.

    backward="autograd" runs the same forward under torch autograd and copies the grads into
    the Params' buffers: the oracle that the hand-written backward is held to. `hooks` (see
    LayerHooks) run around every layer's forward and backward (ZeRO-3). `memory`: the
    kernels.memory.MemoryAccount that holds the microbatch's saved contexts, layer by layer.
    """
    if backward == "autograd":
        return _forward_backward_autograd(layers, ids, targets, denom, hooks)
    ctxs = []
    x = ids
    for layer in layers[:-1]:
        hooks and hooks.before_forward(layer)
        with events.span(f"F {layer_span_name(layer)}", "layer"):  # leaf compute; the F+B around is not
            x, c = layer.forward(x)
        hooks and hooks.after_forward(layer)
        ctxs.append(c)
        memory and memory.stack("microbatch", c)
    head = layers[-1]
    hooks and hooks.before_forward(head)
    with events.span("F+B head (loss)", "layer"):
        loss, c_head = head.forward(x, targets, denom)
        dx = head.backward_input(c_head)
        head.backward_weight(c_head)
    aux = sum((getattr(c, "aux_loss", 0.0) for c in ctxs), 0.0)
    hooks and hooks.after_backward(head)
    for layer, c in zip(reversed(layers[:-1]), reversed(ctxs)):
        hooks and hooks.before_backward(layer)
        with events.span(f"B+W {layer_span_name(layer)}", "layer"):
            dx = layer.backward_input(c, dx)
            layer.backward_weight(c)
        hooks and hooks.after_backward(layer)
        memory and memory.unstack("microbatch")
    return loss + aux


def _forward_backward_autograd(layers, ids, targets, denom, hooks=None):
    for layer in layers:  # ZeRO-3: hold every layer's gathered params for the whole graph
        hooks and hooks.before_forward(layer)
    prms = [q for layer in layers for q in layer.params().values()]
    saved = [q.data for q in prms]
    leaves = [d.detach().requires_grad_(True) for d in saved]
    for q, leaf in zip(prms, leaves):
        q.data = leaf
    try:
        with torch.enable_grad(), events.span("F+B autograd", "layer"):
            x = ids
            aux = 0.0
            for layer in layers[:-1]:
                x, c = layer.forward(x)
                aux = aux + getattr(c, "aux_loss", 0.0)
            loss, _ = layers[-1].forward(x, targets, denom)
            total = loss + aux
            grads = torch.autograd.grad(total, leaves, allow_unused=True)
    finally:
        for q, d in zip(prms, saved):
            q.data = d
    for q, g in zip(prms, grads):
        if g is not None:
            q.accumulate(g.detach())
    for layer in reversed(layers):
        hooks and hooks.after_backward(layer)
    return total.detach()


def reference_step(model: Llama, ids, targets, microbatches: int = 1, backward: str = "hand"):
    """One single-process step's forward and backward over the global batch: the oracle."""
    denom = ids.numel()
    loss = 0.0
    for mb_ids, mb_t in zip(ids.chunk(microbatches), targets.chunk(microbatches)):
        loss = loss + forward_backward(model.layers, mb_ids, mb_t, denom, backward)
    return loss
