"""Hand-written layers: forward, backward_input (dX) and backward_weight (dW), no autograd."""
from kernels.layers.attention import (
                                      Attention,
                                      LocalAttention,
                                      attention_block_backward,
                                      attention_block_forward,
)
from kernels.layers.base import Ctx, Layer, Param
from kernels.layers.linear import Embedding, Linear
from kernels.layers.loss import CrossEntropy
from kernels.layers.mlp import SwiGLU
from kernels.layers.norm import RMSNorm
from kernels.layers.rope import apply_rope, apply_rope_backward, rope_tables

__all__ = ["Attention", "LocalAttention", "attention_block_forward", "attention_block_backward",
           "Ctx", "Layer", "Param", "Embedding", "Linear", "CrossEntropy", "SwiGLU", "RMSNorm",
           "apply_rope", "apply_rope_backward", "rope_tables"]
