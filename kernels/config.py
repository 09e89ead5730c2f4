"""The tiny Llama's shape: its config and presets, the global shape of every parameter, and the
MoE layer's stacked expert shapes. Torch-free, so the app and the CLI validate plans without
loading torch; the seeded init every rank draws its shards from is kernels/weights.py.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from kernels.mesh import Plan


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

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def ffn_hidden(self) -> int:
        return self.hidden or max(16, int(round(8 * self.dim / 3 / 16)) * 16)

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
    e, h, d = cfg.experts, cfg.ffn_hidden, cfg.dim
    return {prefix + "router.weight": (e, d), prefix + "experts.w1.weight": (e, h, d),
            prefix + "experts.w3.weight": (e, h, d), prefix + "experts.w2.weight": (e, d, h)}


def is_moe_layer(cfg: ModelConfig, i: int) -> bool:
    return cfg.experts > 0 and i % cfg.moe_every == cfg.moe_every - 1


def model_config_for(plan: Plan, cfg: ModelConfig) -> ModelConfig:
    """The plan's MoE fields override the model's (experts, top_k, capacity_factor)."""
    if plan.experts:
        cfg = replace(cfg, experts=plan.experts, top_k=plan.top_k,
                      capacity_factor=plan.capacity_factor)
    return cfg
