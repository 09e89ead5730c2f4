"""The grad sync counts each param's accumulations as the runner reports them (runner.accumulations(),
a pipeline's from Schedule.accumulations), so a bucket's all-reduce goes out during the action that
makes its last weight grad. Before, it counted plan.microbatches: DualPipe's chunks, which take
half the microbatches each, never got there and every bucket waited for the flush after backward.

The overlap figure is timing and noisy; what the fix decides is deterministic: the pipeline compute
action (its index in the rank's list of computes) during which each bucket's all-reduce is issued.
A bucket holds one chunk's params (runner.bucket_key), so it need not wait for another chunk."""
import pytest

from kernels.comm import events
from kernels.engine import Engine
from planning.config import make_config
from planning.mesh import Plan
from planning.pipeline.actions import COMPUTE_KINDS
from planning.pipeline.catalog import build_schedule
from planning.validate import validate
from worlds import run_world

# the six schedules at pp 2, M 4 (interleaved: 2 chunks a rank over the tiny model's 4 layers)
SCHEDULES = [("gpipe", None), ("1f1b", None), ("interleaved", 2), ("zb1p", None),
             ("dualpipe", None), ("dualpipev", None)]
PIPELINE_SPAN_CATS = ("F", "B", "W", "FB")   # kernels/pp/step.py: one span per compute action (BW's is "B")
BUCKET_MB = 0.05                             # several buckets a rank (the tiny model is 0.83 MiB)


@pytest.mark.parametrize("name,virtual,pp,m,want", [
    ("gpipe", None, 2, 4, [[4], [4]]),
    ("1f1b", None, 4, 8, [[8]] * 4),
    ("interleaved", 2, 2, 4, [[4, 4], [4, 4]]),
    ("zb1p", None, 2, 4, [[4], [4]]),                # W accumulates, B only queues it
    ("dualpipe", None, 2, 4, [[2, 2], [2, 2]]),      # a chunk carries one direction: M/2
    ("dualpipe", None, 4, 8, [[4, 4]] * 4),
    ("dualpipev", None, 2, 4, [[4, 4], [4, 4]]),     # FB's backward half counts for chunk2
])
def test_schedule_accumulations_per_chunk(name, virtual, pp, m, want):
    s = build_schedule(name, pp, m, virtual)
    assert [[s.accumulations(r, c) for c in range(s.chunks_per_rank)] for r in range(pp)] == want


class IssueIndexRecorder:
    """events recorder: for each dp all-reduce, how many pipeline compute actions had ended."""

    def __init__(self):
        self.computes_done = 0
        self.issued_at: list[int] = []

    def compute(self, name, cat, t0, t1, args):
        if cat in PIPELINE_SPAN_CATS:
            self.computes_done += 1

    def comm_issue(self, op_id, op, group, nbytes, peer, t_ns, args):
        if op == "all_reduce" and group == "dp":
            self.issued_at.append(self.computes_done)


def _issue_indices(rank, world, schedule, virtual):
    """One step of dp 2 x pp 2: (pp rank, the local chunks of each dp bucket's params, the compute
    index at each bucket's all-reduce issue, computes run)."""
    cfg = make_config("tiny")
    plan = validate(Plan(dp=2, pp=2, schedule=schedule, microbatches=4, virtual_stages=virtual or 1,
                         bucket_mb=BUCKET_MB), cfg, world)
    eng = Engine(plan, cfg, rank, optim="sgd")
    chunk_of = {id(p): ch.index for ch in eng.runner.chunks for p in ch.params().values()}
    bucket_chunks = [sorted({chunk_of[id(p)] for p in u.params}) for u in eng.sync.units]
    rec = IssueIndexRecorder()
    events.set_recorder(rec)
    try:
        eng.step()
    finally:
        events.set_recorder(None)
    return eng.ctx.coords["pp"], bucket_chunks, rec.issued_at, rec.computes_done


def expected_issue_indices(schedule, pp_rank: int, bucket_chunks: list[list[int]]) -> list[int]:
    """Each bucket goes out in the compute that makes the last weight grad of its chunks (W, BW,
    FB's backward half), but never before the buckets ahead of it (gloo matches them by order)."""
    computes = [a for a in schedule.actions[pp_rank] if a.kind in COMPUTE_KINDS]
    last = {}
    for i, a in enumerate(computes):
        if a.kind in ("W", "BW"):
            last[a.chunk] = i
        elif a.kind == "FB":
            last[a.chunk2] = i
    out, so_far = [], 0
    for chunks in bucket_chunks:
        so_far = max([so_far] + [last[c] for c in chunks])
        out.append(so_far)
    return out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("schedule,virtual", SCHEDULES, ids=[s for s, _ in SCHEDULES])
def test_each_bucket_is_issued_in_the_action_of_its_last_weight_grad(schedule, virtual):
    results = run_world(4, _issue_indices, schedule, virtual, timeout_s=240)
    s = build_schedule(schedule, 2, 4, virtual)
    seen = set()
    for pp_rank, bucket_chunks, issued_at, computes_done in results:
        seen.add(pp_rank)
        n_computes = sum(a.kind in COMPUTE_KINDS for a in s.actions[pp_rank])
        assert computes_done == n_computes
        assert len(bucket_chunks) > 1                    # several buckets, so the order shows
        assert all(len(chunks) == 1 for chunks in bucket_chunks)   # runner.bucket_key: one chunk a bucket
        want = expected_issue_indices(s, pp_rank, bucket_chunks)
        assert issued_at == want, (pp_rank, bucket_chunks)
        assert max(want) < n_computes                    # none waits for the flush after backward
    assert seen == {0, 1}


def test_dualpipe_head_chunk_buckets_go_out_two_computes_before_the_end():
    """dp 2 x pp 2 DualPipe, pp rank 0: chunk 1 (layers 2-3, head: the first buckets in backward
    order) makes its last weight grad in compute 5 of 8 (BW mb 3), chunk 0 in compute 7 (W mb 1)."""
    s = build_schedule("dualpipe", 2, 4)
    assert expected_issue_indices(s, 0, [[1], [1], [0], [0]]) == [5, 5, 7, 7]
