"""The runners: what runs a rank's microbatches within one step (the pipeline's executor lives
with its schedules in kernels/pp).

    microbatch   the microbatch loop without a pipeline (the interface every runner shares)
    ep_overlap   two microbatches: one's all-to-all behind the other's compute
"""
