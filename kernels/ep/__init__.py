"""Expert parallelism: Mixture-of-Experts layers with their experts sharded over the ep group.

    routing        GShard gating and the expert math on one rank's tokens (and the MoE parameter shapes)
    deepseek       DeepSeek-V3 routing: forward, hand backward, the bias step
    layer          the MoE layer: all-to-all dispatch, local experts, combine, in phases
    deepseek_layer the DeepSeek layer and its selection bias
    build          a block's MoE layer from the global tensors
    routing_load   the routing observatory's collector
The runner that interleaves two microbatches lives with the other runners (kernels/runners).
"""
