"""The tiny Llama's shape: its config and presets, the global shape of every parameter, and the
MoE layer's stacked expert shapes. Torch-free, so the app and the CLI validate plans without
loading torch; the seeded init every rank draws its shards from is kernels/weights.py.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from planning.mesh import Plan


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 256
    dim: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    seq: int = 32
    batch: int = 8            # global batch (sequences per step)
    hidden: int = 0           # SwiGLU hidden size; 0 means round(8/3 * dim) to a multiple of 16
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    experts: int = 0          # 0: dense MLP; > 0: MoE (kernels/ep)
    top_k: int = 2
    capacity_factor: float | None = None   # None: no capacity limit
    moe_every: int = 1        # every n-th layer is MoE (1: all)
    aux_loss_coef: float = 0.01
    routing_group: int = 0    # tokens per routing group for capacity; 0: one sequence
    # DeepSeek-V3's MoE (kernels/ep/deepseek.py); gshard ignores these
    moe: str = "gshard"       # gshard (softmax, capacity, aux loss) or deepseek (sigmoid, bias)
    moe_hidden: int = 0       # each routed expert's hidden size; 0: ffn_hidden (fine-grained: less)
    shared_experts: int = 0   # always-applied experts beside the routed ones (deepseek)
    route_scale: float = 1.0  # gate values (normalised to sum 1) times this
    route_groups: int = 1     # experts in G groups; each token picks route_topk_groups of them
    route_topk_groups: int = 1
    seq_aux_alpha: float = 0.0   # the complementary sequence-wise balance loss weight
    balance: str = "none"     # "bias": auxiliary-loss-free balancing of the selection bias
    bias_gamma: float = 0.001    # bias update speed

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def ffn_hidden(self) -> int:
        return self.hidden or max(16, int(round(8 * self.dim / 3 / 16)) * 16)

    @property
    def expert_hidden(self) -> int:
        """A routed expert's SwiGLU hidden size (DeepSeek's fine-grained experts are narrower)."""
        return self.moe_hidden or self.ffn_hidden

    def validate(self) -> None:
        def need(ok, msg):
            if not ok:
                raise ValueError(msg)
        for name in ("vocab", "dim", "layers", "heads", "kv_heads", "seq", "batch", "moe_every"):
            need(getattr(self, name) >= 1, f"model {name} = {getattr(self, name)} must be >= 1")
        need(self.dim % self.heads == 0,
             f"dim {self.dim} is not divisible by heads {self.heads}: pick dim a multiple of heads")
        need(self.heads % self.kv_heads == 0,
             f"heads {self.heads} not divisible by kv heads {self.kv_heads}: kv heads must divide heads")
        need(self.head_dim % 2 == 0, f"head dim {self.head_dim} must be even for RoPE")

    def n_params(self) -> int:
        return sum(math.prod(s) for s in param_shapes(self).values())

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS = {
    "tiny": ModelConfig(),
    "small": ModelConfig(vocab=256, dim=128, layers=8, heads=8, kv_heads=4, seq=64, batch=8),
    "medium": ModelConfig(vocab=512, dim=256, layers=8, heads=8, kv_heads=4, seq=128, batch=8),
    "large": ModelConfig(vocab=1024, dim=512, layers=8, heads=8, kv_heads=4, seq=128, batch=8),
    # DeepSeek-V3's MoE scaled down: 8 fine-grained routed experts (a quarter of the dense
    # hidden) in 2 groups, top-2 inside the best group, 1 shared expert, bias balancing, and the
    # sequence-wise loss (V3: 256 routed in 8 groups, top-8 in 4 groups, 1 shared, alpha 1e-4)
    "deepseek-tiny": ModelConfig(experts=8, top_k=2, moe="deepseek", moe_hidden=48,
                                 shared_experts=1, route_groups=2, route_topk_groups=1,
                                 route_scale=1.0, seq_aux_alpha=1e-4, balance="bias",
                                 bias_gamma=0.001),
}


def make_config(preset: str = "tiny", **overrides) -> ModelConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}: pick one of {', '.join(PRESETS)}")
    cfg = replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})
    cfg.validate()
    return cfg


# ---------------------------------------------------------------- parameters

def param_shapes(cfg: ModelConfig) -> dict[str, tuple]:
    """Global shape of every parameter, in forward order (the order of a reverse-order bucketing)."""
    d, hd = cfg.dim, cfg.head_dim
    shapes = {"embed.weight": (cfg.vocab, d)}
    for i in range(cfg.layers):
        pre = f"layers.{i}."
        shapes.update({pre + "attn_norm.weight": (d,), pre + "attn.wq.weight": (cfg.heads * hd, d),
                       pre + "attn.wk.weight": (cfg.kv_heads * hd, d),
                       pre + "attn.wv.weight": (cfg.kv_heads * hd, d),
                       pre + "attn.wo.weight": (d, cfg.heads * hd), pre + "mlp_norm.weight": (d,)})
        if is_moe_layer(cfg, i):
            shapes.update(moe_param_shapes(cfg, pre + "moe."))
        else:
            shapes.update({pre + "mlp.w1.weight": (cfg.ffn_hidden, d),
                           pre + "mlp.w3.weight": (cfg.ffn_hidden, d),
                           pre + "mlp.w2.weight": (d, cfg.ffn_hidden)})
    shapes.update({"norm.weight": (d,), "lm_head.weight": (cfg.vocab, d)})
    return shapes


def moe_param_shapes(cfg, prefix: str) -> dict[str, tuple]:
    """An MoE layer's global parameters: one tensor per kind, stacked over experts (dim 0), so
    expert parallelism shards dim 0."""
    e, h, d = cfg.experts, cfg.expert_hidden, cfg.dim
    shapes = {prefix + "router.weight": (e, d), prefix + "experts.w1.weight": (e, h, d),
              prefix + "experts.w3.weight": (e, h, d), prefix + "experts.w2.weight": (e, d, h)}
    if cfg.moe == "deepseek" and cfg.shared_experts:   # N shared experts = one SwiGLU N times wider
        hs = cfg.shared_experts * h
        shapes.update({prefix + "shared.w1.weight": (hs, d), prefix + "shared.w3.weight": (hs, d),
                       prefix + "shared.w2.weight": (d, hs)})
    return shapes


def is_moe_layer(cfg: ModelConfig, i: int) -> bool:
    return cfg.experts > 0 and i % cfg.moe_every == cfg.moe_every - 1


# Plan fields that override the model's DeepSeek fields when given (None: the model's)
ROUTING_FIELDS = ("moe", "moe_hidden", "shared_experts", "route_scale", "route_groups",
                  "route_topk_groups", "seq_aux_alpha", "balance", "bias_gamma")


def model_config_for(plan: Plan, cfg: ModelConfig) -> ModelConfig:
    """The plan's MoE fields override the model's: experts (when given), top_k and capacity_factor
    for any MoE model, and each DeepSeek routing field the plan sets."""
    if plan.experts or cfg.experts:
        cfg = replace(cfg, experts=plan.experts or cfg.experts, top_k=plan.top_k,
                      capacity_factor=plan.capacity_factor)
    given = {f: getattr(plan, f) for f in ROUTING_FIELDS if getattr(plan, f) is not None}
    return replace(cfg, **given) if given else cfg
