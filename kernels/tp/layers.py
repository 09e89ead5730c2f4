"""Tensor parallel Llama by hand (Megatron-LM layout), with sequence parallel as an option.

Each tp rank keeps a piece of every weight (`Param.shard` says which rows / columns):
    column parallel  wq, wk, wv, w1, w3, lm_head, embed   rows of the global [out, in] weight
    row parallel     wo, w2                               columns
    replicated       the RMSNorm weights
Megatron's two conjugate operators sit in the Block's regions (kernels/tp/regions.py):
    f = CopyToTP      identity forward, all-reduce of dX backward   (before the column linears)
    g = ReduceFromTP  all-reduce forward, identity backward         (after the row linears)
With sequence parallel (`plan.sp`) the residual stream and the norms live on a 1/tp slice of the
sequence; f becomes an all-gather along seq (reduce-scatter of dX backward) and g a
reduce-scatter (all-gather backward), so the norms' weight grads are partial over tp.

Grouped-query attention: with kv_heads % tp == 0 the kv heads are sharded like the q heads;
with tp > kv_heads each kv head sits on tp / kv_heads ranks (the ones whose q heads use it) and
its wk / wv grads are summed over the "tp_kv" group of those ranks.
MoE layers are not split by tp: every tp rank runs the whole MoE (its ep shard) on the full
sequence, so their grads are whole on each tp rank (not with sp: routing needs whole sequences).

Vocab parallel: the embedding keeps rows [v0, v1) of the table (zero for other ids) and its
output is summed over tp; the lm_head keeps the same vocab rows, and the loss is the
vocab-parallel cross-entropy of kernels/tp/loss.py, so full logits are never gathered. With sp
the head all-gathers the sequence before the lm_head: every rank computes the loss of every
token of its slice of the vocabulary, and the loss is the same on all tp ranks.

Backward hides the dX collective of each f region behind that branch's weight grads: the
collective is issued async, the branch's dW run, then it is waited on. Schedules that defer W
(zb1p, DualPipe) keep dW for later instead, so there the collective is waited on at once.
"""
from __future__ import annotations

import torch

from kernels import comm
from kernels.block import Block
from kernels.comm import events
from kernels.ep.build import build_moe
from kernels.layers import (Attention, Ctx, Embedding, Linear, LocalAttention, Param, RMSNorm, SwiGLU,
                            rope_tables)
from kernels.model import Embed, Head
from kernels.recompute import recomputed
from kernels.tp.loss import VocabParallelCrossEntropy
from kernels.tp.regions import CopyToTP, GatherSeqToTP, ReduceFromTP, ScatterSeqFromTP, start_region_backward
from planning.config import is_moe_layer
from planning.mesh import partition
from planning.pipeline.catalog import schedule_spec

# ---------------------------------------------------------------- stage layers

class TPBlock(Block):
    """A Block whose backward hides each f region's dX collective behind its branch's dW."""

    def __init__(self, *args, overlap_weight_grad: bool = True, **kw):
        super().__init__(*args, **kw)
        self.overlap_weight_grad = overlap_weight_grad

    def backward_entry_under_weights(self, ctx, branch: str, dx):
        """The entry region's dX collective issued async, the branch's dW run under it, then waited."""
        pending = start_region_backward(*self.entry_of(ctx, branch), dx)
        layer, c_layer = (self.attn, ctx.c_a) if branch == "attn" else (self.mlp, ctx.c_m)
        with events.span(f"{branch} dW (under dX comm)", "W", layer=self.index):
            layer.backward_weight(c_layer)
        ctx.weights_done = (*getattr(ctx, "weights_done", ()), branch)   # backward_weight skips them
        return pending.wait()

    def backward_input(self, ctx, dy):                       # dy [B, S or S/tp, D]
        if not self.overlap_weight_grad:
            return super().backward_input(ctx, dy)
        ctx = recomputed(self, ctx)                           # under Plan.recompute
        return self.backward_attention(ctx, dy, self.backward_mlp(ctx, dy),
                                       entry=self.backward_entry_under_weights)


class TPEmbed(Embed):
    """Vocab-parallel embedding: this rank's rows (zeros for other ids), summed over tp by
    `exit` (all-reduce, or with sp a reduce-scatter that leaves this rank's sequence slice)."""

    def __init__(self, emb: Embedding, exit_region):
        super().__init__(emb)
        self.exit = exit_region

    def forward(self, ids):                                   # ids [B, S]
        y, c_e = self.emb.forward(ids)                        # [B, S, dim], partial over tp
        y, c_x = self.exit.forward(y)                         # [B, S or S/tp, dim]
        return y, Ctx(c_e=c_e, c_x=c_x)

    def backward_input(self, ctx, dy):
        return self.emb.backward_input(ctx.c_e, self.exit.backward(ctx.c_x, dy))

    def backward_weight(self, ctx):
        self.emb.backward_weight(ctx.c_e)


class TPHead(Head):
    """Norm, f (with sp: all-gather of the sequence), lm_head on this rank's vocab rows and the
    vocab-parallel loss over every token; dX's collective is hidden behind lm_head's dW."""

    def __init__(self, norm, enter, lm_head, loss_fn, overlap_weight_grad: bool = True):
        super().__init__(norm, lm_head, loss_fn)
        self.enter, self.overlap_weight_grad = enter, overlap_weight_grad

    def forward(self, x, targets, denom):                     # x [B, S or S/tp, D], targets [B, S]
        n, c_n = self.norm.forward(x)
        e, c_e = self.enter.forward(n)                        # [B, S, D]
        logits, c_l = self.lm_head.forward(e)                 # [B, S, vocab / tp]
        b, s, v = logits.shape
        loss, c_ce = self.loss_fn.forward(logits.reshape(b * s, v), targets.reshape(-1), denom)
        return loss, Ctx(c_n=c_n, c_e=c_e, c_l=c_l, c_ce=c_ce, shape=(b, s, v))

    def backward_input(self, ctx, dloss=1.0):
        dlogits = self.loss_fn.backward_input(ctx.c_ce, dloss).reshape(ctx.shape)
        dn = self.lm_head.backward_input(ctx.c_l, dlogits)     # [B, S, D], partial over tp
        pending = start_region_backward(self.enter, ctx.c_e, dn)
        if self.overlap_weight_grad:
            with events.span("lm_head dW (under dX comm)", "W"):
                self.lm_head.backward_weight(ctx.c_l)
        ctx.weights_done = self.overlap_weight_grad
        return self.norm.backward_input(ctx.c_n, pending.wait())

    def backward_weight(self, ctx):
        if not getattr(ctx, "weights_done", False):
            self.lm_head.backward_weight(ctx.c_l)
        self.norm.backward_weight(ctx.c_n)


# ---------------------------------------------------------------- building this rank's shards

def check_tp_shapes(cfg, tp: int, sp: bool, cp: int = 1) -> None:
    """The shapes tensor parallel splits (planning.validate checks them first, for the CLI)."""
    local_seq = cfg.seq // cp                     # sp splits each cp rank's tokens again
    problems = [(cfg.heads % tp, f"{cfg.heads} heads"), (cfg.vocab % tp, f"vocab {cfg.vocab}"),
                (cfg.ffn_hidden % tp, f"MLP hidden {cfg.ffn_hidden}"),
                (sp and local_seq % tp, f"the {local_seq} tokens a rank holds (seq {cfg.seq} / cp "
                                        f"{cp}) for sequence parallel")]
    for bad, what in problems:
        if bad:
            raise ValueError(f"tp {tp} does not divide {what}: pick tp dividing it")
    if cfg.kv_heads % tp and tp % cfg.kv_heads:
        raise ValueError(f"tp {tp} and {cfg.kv_heads} kv heads: tp must divide the kv heads "
                         f"(sharded) or be a multiple of them (replicated)")
    if cfg.experts and sp:
        raise ValueError("sequence parallel cannot run MoE layers on sequence shards (a routing "
                         "group is one whole sequence): drop sp or experts")


def shard(tensors: dict, name: str, dim: int, start: int, stop: int) -> Param:
    """This rank's rows (dim 0) or columns (dim 1) [start, stop) of a global weight."""
    full = tensors[name]
    index = tuple(slice(start, stop) if d == dim else slice(None) for d in range(full.dim()))
    return Param(name, full[index].clone(), global_shape=full.shape, shard=index)


def whole(tensors: dict, name: str, replicated_over: list[str]) -> Param:
    prm = Param(name, tensors[name])
    prm.replicated_over = list(replicated_over)
    return prm


def kv_layout(cfg, ctx) -> tuple[int, int, list[str]]:
    """(first local kv head, local kv heads, groups its grads are summed over).

    Sharded when tp divides the kv heads. Otherwise the kv head of this rank's q heads is
    replicated on tp / kv_heads consecutive tp ranks; every rank creates every such group, in
    the same order, because process groups must be made collectively."""
    tp, r = ctx.plan.tp, ctx.coords["tp"]
    if cfg.kv_heads % tp == 0:
        per_rank = cfg.kv_heads // tp
        return r * per_rank, per_rank, []
    ranks_per_head = tp // cfg.kv_heads
    if "tp_kv" not in ctx.groups:
        pieces = [ranks[i:i + ranks_per_head] for ranks in partition(ctx.plan, "tp")
                  for i in range(0, len(ranks), ranks_per_head)]
        ctx.groups["tp_kv"] = comm.new_groups("tp_kv", pieces)
    return r // ranks_per_head, 1, ["tp_kv"]


def build_tp_layers(cfg, tensors: dict, ctx) -> list:
    """[TPEmbed, TPBlock 0..L-1, TPHead] holding this tp rank's pieces of the global tensors."""
    plan = ctx.plan
    tp, r, group = plan.tp, ctx.coords["tp"], ctx.groups["tp"]
    check_tp_shapes(cfg, tp, plan.sp, plan.cp)
    assert group.size == tp and group.rank == r, "tp group does not match the tp coordinate"
    hd, dtype = cfg.head_dim, tensors["embed.weight"].dtype
    heads = cfg.heads // tp
    kv0, kv_local, kv_groups = kv_layout(cfg, ctx)
    hidden = cfg.ffn_hidden // tp
    vocab = cfg.vocab // tp
    norm_groups = ["tp"] if plan.sp else []   # sp: each rank's norm grad covers its tokens only
    enter = (lambda: GatherSeqToTP(group)) if plan.sp else (lambda: CopyToTP(group))
    exit_ = (lambda: ScatterSeqFromTP(group)) if plan.sp else (lambda: ReduceFromTP(group))
    overlap = not (plan.pp > 1 and schedule_spec(plan.schedule).split_w)

    positions = torch.arange(cfg.seq)
    cos, sin = rope_tables(positions, hd, cfg.rope_theta, dtype)
    layers = [TPEmbed(Embedding(shard(tensors, "embed.weight", 0, r * vocab, (r + 1) * vocab),
                                vocab_start=r * vocab), exit_())]
    for i in range(cfg.layers):
        pre = f"layers.{i}."

        def col(n, start, stop):
            return Linear(shard(tensors, pre + n, 0, start, stop))

        def row(n, start, stop):
            return Linear(shard(tensors, pre + n, 1, start, stop))

        wk, wv = col("attn.wk.weight", kv0 * hd, (kv0 + kv_local) * hd), \
            col("attn.wv.weight", kv0 * hd, (kv0 + kv_local) * hd)
        wk.weight.replicated_over = wv.weight.replicated_over = list(kv_groups)
        attn = Attention(col("attn.wq.weight", r * heads * hd, (r + 1) * heads * hd), wk, wv,
                         row("attn.wo.weight", r * heads * hd, (r + 1) * heads * hd),
                         heads, kv_local, hd, cos, sin, LocalAttention(positions))
        regions = {"enter_attn": enter(), "exit_attn": exit_()}
        if is_moe_layer(cfg, i):  # experts are not split by tp: every tp rank runs the whole MoE
            mlp = build_moe(cfg, pre + "moe.", tensors, ctx)
        else:
            mlp = SwiGLU(col("mlp.w1.weight", r * hidden, (r + 1) * hidden),
                         col("mlp.w3.weight", r * hidden, (r + 1) * hidden),
                         row("mlp.w2.weight", r * hidden, (r + 1) * hidden))
            regions.update(enter_mlp=enter(), exit_mlp=exit_())
        layers.append(TPBlock(i, RMSNorm(whole(tensors, pre + "attn_norm.weight", norm_groups),
                                         cfg.norm_eps), attn,
                              RMSNorm(whole(tensors, pre + "mlp_norm.weight", norm_groups),
                                      cfg.norm_eps), mlp, regions, overlap_weight_grad=overlap))
    layers.append(TPHead(RMSNorm(whole(tensors, "norm.weight", norm_groups), cfg.norm_eps),
                         enter(), Linear(shard(tensors, "lm_head.weight", 0, r * vocab,
                                               (r + 1) * vocab)),
                         VocabParallelCrossEntropy(group, r * vocab, (r + 1) * vocab),
                         overlap_weight_grad=overlap))
    return layers
