"""The transformer Block, and its backward cut once into DeepSeek's parts (planning/pipeline/fb_order.py
names them), so every runner regroups the same math:

    part          input grads                               weight grads
    COMBINE (MoE) backward_combine: the combine's dX,         -
                  issues COMBINE(B)
    MLP           backward_mlp (dense, or a whole MoE);       backward_mlp_weight
                  an MoE cut into parts: mlp.backward_experts,
                  issues DISPATCH(B)
    ATTN          backward_attention: the MLP's entry, its    backward_attention_weight (with the
                  norm, the attention branch, the residuals   MoE router's, whose grad ATTN makes)

Block.backward_input / backward_weight run them back to back; kernels/tp/layers.py's TPBlock hides each
entry region's dX collective under its branch's weight grads; kernels/runners/ep_overlap.py interleaves two
microbatches' parts; kernels/pp/parts.py runs them in an overlapped F&B pair's order.
"""
from __future__ import annotations

from kernels.layers import Ctx, Layer
from kernels.recompute import recomputed, slimmed


class Identity:
    """A region boundary that does nothing (tensor parallel replaces it with f / g)."""

    def forward(self, x):
        return x, None

    def backward(self, ctx, dy):
        return dy


class Block(Layer):
    """Pre-norm residual block: h = x + attn(norm(x)); y = h + mlp(norm(h)).

    `enter_*` / `exit_*` wrap each branch (tensor parallel's f and g, sequence parallel's
    all-gather and reduce-scatter); identity by default.
    """

    def __init__(self, index, attn_norm, attn, mlp_norm, mlp, regions: dict | None = None):
        self.index = index
        self.attn_norm, self.attn, self.mlp_norm, self.mlp = attn_norm, attn, mlp_norm, mlp
        regions = regions or {}
        self.enter_attn = regions.get("enter_attn", Identity())
        self.exit_attn = regions.get("exit_attn", Identity())
        self.enter_mlp = regions.get("enter_mlp", Identity())
        self.exit_mlp = regions.get("exit_mlp", Identity())

    @property
    def is_moe(self) -> bool:
        return getattr(self.mlp, "is_moe", False)

    def sublayers(self):
        return {"attn_norm": self.attn_norm, "attn": self.attn, "mlp_norm": self.mlp_norm,
                ("moe" if self.is_moe else "mlp"): self.mlp}

    def forward_to_mlp(self, x):                            # x [B, S, dim]
        """The block up to the MLP's input: (h, mlp input, ctx). The EP overlap runner splits here."""
        n1, c_n1 = self.attn_norm.forward(x)
        e1, c_e1 = self.enter_attn.forward(n1)
        a, c_a = self.attn.forward(e1)
        a, c_x1 = self.exit_attn.forward(a)
        h = x + a
        n2, c_n2 = self.mlp_norm.forward(h)
        e2, c_e2 = self.enter_mlp.forward(n2)
        return h, e2, Ctx(c_n1=c_n1, c_e1=c_e1, c_a=c_a, c_x1=c_x1, c_n2=c_n2, c_e2=c_e2,
                          norm_fed=(e1 is n1, e2 is n2))   # linears saved the norm's own output

    def finish_forward(self, h, m, c_m, ctx):
        """Residual after the MLP's output m; completes the ctx backward_input expects."""
        m, ctx.c_x2 = self.exit_mlp.forward(m)
        ctx.c_m, ctx.aux_loss = c_m, getattr(c_m, "aux_loss", 0.0)
        return h + m, ctx

    recompute = "none"   # Plan.recompute: what the forward keeps (kernels/recompute.py)

    def forward(self, x, save_all: bool = False):           # x [B, S, dim]
        h, e2, ctx = self.forward_to_mlp(x)
        y, ctx = self.finish_forward(h, *self.mlp.forward(e2), ctx)
        keep = "none" if save_all else self.recompute
        return y, (ctx if keep == "none" else Ctx(x=x, aux_loss=ctx.aux_loss) if keep == "full"
                   else slimmed(self, ctx, x, h))

    # ---------------------------------------------------------------- backward, part by part
    def backward_combine(self, ctx, dy) -> None:             # dy [B, S, dim]
        """COMBINE of an MoE block: the combine's dX; issues the all-to-all COMBINE(B)."""
        self.mlp.backward_combine(ctx.c_m, self.exit_mlp.backward(ctx.c_x2, dy))

    def backward_mlp(self, ctx, dy):                         # dy [B, S or S/tp, dim]
        """MLP's input grads, dense or a whole MoE: the block's output grad -> the grad at the MLP's input."""
        return self.mlp.backward_input(ctx.c_m, self.exit_mlp.backward(ctx.c_x2, dy))

    def entry_of(self, ctx, branch: str):
        """(the region entering `branch`, attn or mlp; its saved context)."""
        return (self.enter_attn, ctx.c_e1) if branch == "attn" else (self.enter_mlp, ctx.c_e2)

    def backward_entry(self, ctx, branch: str, dx):
        """The backward of the region entering `branch`: identity, or tensor parallel's dX collective
        (TPBlock.backward_entry_under_weights hides it under the branch's weight grads)."""
        region, c_region = self.entry_of(ctx, branch)
        return region.backward(c_region, dx)

    def backward_attention(self, ctx, dy, dm, entry=None):
        """ATTN's input grads: dy the block's output grad, dm the grad at the MLP's input (backward_mlp's, or
        an MoE's dispatch backward); returns dx. entry(ctx, branch, dx): each entry region's backward
        (default backward_entry)."""
        entry = entry or self.backward_entry
        dh = dy + self.mlp_norm.backward_input(ctx.c_n2, entry(ctx, "mlp", dm))
        da = self.exit_attn.backward(ctx.c_x1, dh)
        da = self.attn.backward_input(ctx.c_a, da)
        return dh + self.attn_norm.backward_input(ctx.c_n1, entry(ctx, "attn", da))

    def backward_mlp_weight(self, ctx) -> None:
        """MLP_W: the MLP's weight grads (an MoE's experts: its router's come with ATTN_W)."""
        if "mlp" in getattr(ctx, "weights_done", ()):
            return
        if self.is_moe:
            self.mlp.backward_expert_weights(ctx.c_m)
        else:
            self.mlp.backward_weight(ctx.c_m)

    def backward_attention_weight(self, ctx) -> None:
        """ATTN_W: the MoE router's weight grads (ATTN made its grad), the norms' and the attention's."""
        done = getattr(ctx, "weights_done", ())   # branches whose dW already ran (under TP's dX collective)
        if self.is_moe and "mlp" not in done:
            self.mlp.backward_router_weight(ctx.c_m)
        self.mlp_norm.backward_weight(ctx.c_n2)
        if "attn" not in done:
            self.attn.backward_weight(ctx.c_a)
        self.attn_norm.backward_weight(ctx.c_n1)

    def backward_input(self, ctx, dy):                       # dy [B, S, dim]
        ctx = recomputed(self, ctx)
        return self.backward_attention(ctx, dy, self.backward_mlp(ctx, dy))

    def backward_weight(self, ctx):
        ctx = recomputed(self, ctx)
        self.backward_mlp_weight(ctx)
        self.backward_attention_weight(ctx)
