"""Context parallelism: the sequence split over the cp ranks, and the attention cores that see it.

    layout    which tokens a rank holds: a contiguous block (ring, ulysses, allgather) or the
              zigzag pair of chunks r and 2N-1-r (cut into 2N chunks, so causal work balances)
    ring      ring / zigzag: K/V blocks travel the ring, partial results merged by log-sum-exp;
              allgather: every rank gathers all K/V, the baseline of `partui bench cp`
    ulysses   all-to-all from sequence shards to head shards, full-sequence attention on the
              local heads, and back
    load      attention time, FLOPs and the K/V rotation's overlap with block compute per step,
              in the trace (span cat "attention", counter "attention load") and in the rank's
              per-step stats (the attn_* figures of a step's result)
    apply     make_core and apply_context_parallel: the entry points

Dense parameters stay replicated over cp; their grads are summed over "cp_dp" by kernels/dp.
"""
