"""Data parallelism: gradient sync over replicas and the optimizer step that follows it.

    buckets.py  flat buffers of params (DP buckets, ZeRO units) and the order they are synced in
    sync.py     GradSync (the interface the engine drives), NaiveDP, BucketedDP
    zero.py     ZeRO-1/2/3 on sharded flat units
    gather.py   ZeRO-3's layer-by-layer parameter all-gather, prefetch and free

`make_grad_sync` picks the plan's one; it lives here because it chooses among sync and zero,
and zero builds on sync.
"""
from kernels.dp.sync import BucketedDP, GradSync, NaiveDP
from kernels.dp.zero import make_zero

__all__ = ["make_grad_sync"]


def make_grad_sync(ctx, params: dict, optimizer, accumulations: dict[str, int],
                   bucket_key) -> GradSync:
    """The plan's gradient sync: ZeRO stage plan.zero, else bucketed or naive all-reduce.
    The runner's `accumulations` (param name -> grad accumulations a step) say when a bucket is
    final, its `bucket_key` (name -> key) which params may share one; naive DP syncs after
    backward and needs neither."""
    plan = ctx.plan
    if plan.zero:
        return make_zero(ctx, params, optimizer, accumulations, bucket_key)
    if plan.grad_sync == "bucketed":
        return BucketedDP(ctx, params, optimizer, accumulations, bucket_key)
    return NaiveDP(ctx, params, optimizer)
