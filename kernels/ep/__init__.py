"""Expert parallelism: Mixture-of-Experts layers with their experts sharded over the ep group.

    routing   GShard gating and the expert math on one rank's tokens (and the MoE parameter shapes)
    layer     the MoE layer: all-to-all dispatch, local experts, combine, in phases
    load      expert load per step (tokens per expert, dropped, aux loss) for the rank's stats
    overlap   the runner that interleaves two microbatches so one's all-to-all hides behind compute
"""
