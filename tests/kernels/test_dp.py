"""Bucketed, overlapped data parallelism: checked end to end, and its bucket bookkeeping."""
import pytest
import torch

from conftest import check_plan, run_cli
from kernels.dp.buckets import FlatUnit, ReadyOrder, overlap_share
from kernels.layers import Param
from planning.mesh import Plan


def test_bucketed_is_the_default():
    assert Plan().grad_sync == "bucketed"


@pytest.mark.timeout(300)
def test_bucketed_dp2_many_buckets_with_accumulation_reports_overlap():
    s = check_plan("--dp", 2, "--bucket-mb", 0.05, "--microbatches", 2, "--optim", "sgd", steps=5)
    assert 0.0 <= s["grad_sync_overlap"] <= 1.0


@pytest.mark.timeout(300)
def test_naive_dp4():
    check_plan("--dp", 4, "--grad-sync", "naive", steps=3)


@pytest.mark.timeout(300)
def test_bucketed_dp4_adamw():
    check_plan("--dp", 4, "--bucket-mb", 0.2, steps=5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args,words", [
    (("--dp", 2, "--zero", 4), "unknown ZeRO stage 4"),
    (("--zero", 2), "dp = 1"),
    (("--dp", 2, "--bucket-mb", 0), "bucket size"),
    (("--dp", 2, "--bucket-mb", -1), "must be > 0"),
])
def test_bad_input_exits_2(args, words):
    proc = run_cli("run", *args, "--steps", 1, timeout=120)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr


class _Group:
    name, size, ranks = "dp", 2, [0, 1]


def _order(accumulations):
    p = [Param(f"p{i}", torch.zeros(4)) for i in range(3)]
    units = [FlatUnit(0, _Group(), [("p2", p[2]), ("p1", p[1])]), FlatUnit(1, _Group(), [("p0", p[0])])]
    for u in units:
        u.bind_grads()
    issued = []
    order = ReadyOrder(units, accumulations, lambda u: issued.append(u.index), lambda prm: None)
    for q in p:
        q.grad_hooks.append(order.on_grad)
    return p, order, issued


def test_bucket_issues_when_its_last_grad_of_the_last_microbatch_lands():
    p, order, issued = _order({"p0": 2, "p1": 2, "p2": 2})
    p[2].accumulate(torch.ones(4))
    p[1].accumulate(torch.ones(4))
    assert issued == []                       # first microbatch: no sync
    p[0].accumulate(torch.ones(4))            # bucket 1 complete but bucket 0 is not: wait
    p[0].accumulate(torch.ones(4))
    assert issued == []
    p[2].accumulate(torch.ones(4))
    p[1].accumulate(torch.ones(4))
    assert issued == [0, 1]                   # in order, as soon as bucket 0 is final
    assert p[2].grad.data_ptr() == order.units[0].grad.data_ptr()  # grads live in the bucket
    assert order.units[0].grad[:4].tolist() == [2.0] * 4


def test_more_accumulations_than_the_runner_said_names_the_fix():
    p, order, issued = _order({"p0": 1, "p1": 1, "p2": 1})
    p[0].accumulate(torch.ones(4))
    with pytest.raises(RuntimeError, match=r"p0 got gradient accumulation 2 but the runner's "
                                           r"accumulations\(\) said 1 per step"):
        p[0].accumulate(torch.ones(4))


def test_accumulations_per_param_and_flush():
    p, order, issued = _order({"p0": 3, "p1": 1, "p2": 1})
    p[2].accumulate(torch.ones(4))
    p[1].accumulate(torch.ones(4))
    p[0].accumulate(torch.ones(4))
    assert issued == [0]
    order.flush()                             # p0 got 1 of 3: issued after backward anyway
    assert issued == [0, 1]


@pytest.mark.parametrize("accumulations,words", [
    ({"p0": 1, "p2": 1}, "no accumulation count for ['p1']"),
    ({"p0": 1, "p1": 0, "p2": 1}, "{'p1': 0} must be >= 1"),
])
def test_bad_accumulations_name_the_param(accumulations, words):
    with pytest.raises(ValueError) as err:
        _order(accumulations)
    assert words in str(err.value)


def test_overlap_share_from_timestamps():
    class R:
        def __init__(self, a, b):
            self.t_issue, self.t_complete, self.nbytes = a, b, 8
    assert overlap_share([R(10, 20), R(15, 30)], 0, 25) == pytest.approx(15 / 20)
    assert overlap_share([], 0, 10) is None
