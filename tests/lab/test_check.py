"""The --check comparison itself must be able to fail: wrong values, missing pieces, bad names."""
import pytest
import torch

from kernels.check import Reference, compare_pieces, region
from planning.config import make_config
from planning.mesh import Plan
from partui.world.checker import check_step


def _ref():
    ref = Reference(Plan(), make_config("tiny", layers=1))
    return ref.step()


def test_whole_pieces_match_and_cover():
    _, grads = _ref()
    pieces = [[{"name": n, "kind": "slice", "index": None, "tensor": g} for n, g in grads.items()]]
    out = compare_pieces(pieces, grads)
    assert out["max_abs_err"] == 0 and out["missing"] == []


def test_split_pieces_cover_and_a_wrong_element_is_caught():
    _, grads = _ref()
    name = "layers.0.attn.wq.weight"
    g = grads[name]
    half = g.shape[0] // 2
    flat = g.reshape(-1)
    pieces = [[{"name": name, "kind": "slice", "index": [[0, half], [0, g.shape[1]]],
                "tensor": g[:half].clone()}],
              [{"name": name, "kind": "flat", "index": [half * g.shape[1], flat.numel()],
                "tensor": flat[half * g.shape[1]:].clone()}]]
    only = {name: g}
    assert compare_pieces(pieces, only)["missing"] == []
    pieces[1][0]["tensor"][3] += 0.5
    out = compare_pieces(pieces, only)
    assert out["max_abs_err"] == pytest.approx(0.5, rel=1e-6)
    assert out["worst"] == f"{name} on rank 1"


def test_missing_coverage_is_reported():
    _, grads = _ref()
    name = "norm.weight"
    pieces = [[{"name": name, "kind": "flat", "index": [0, 10], "tensor": grads[name][:10]}]]
    assert compare_pieces(pieces, {name: grads[name]})["missing"] == [name]


def test_unknown_parameter_is_an_error():
    _, grads = _ref()
    with pytest.raises(KeyError, match="unknown parameter"):
        compare_pieces([[{"name": "nope", "kind": "slice", "index": None,
                          "tensor": torch.zeros(1)}]], grads)


def test_region_slices_and_flat_ranges():
    t = torch.arange(12).reshape(3, 4)
    assert region(t, "slice", [[1, 3], [0, 2]]).tolist() == [[4, 5], [8, 9]]
    assert region(t, "flat", [5, 8]).tolist() == [5, 6, 7]


def _flat_pieces(full: dict) -> list[dict]:
    return [{"name": n, "kind": "flat", "index": [0, t.numel()], "tensor": t.reshape(-1)} for n, t in full.items()]


def _plan_side(steps=2, perturb_param=None):
    """A stand-in for a world's step items: a second Reference plays the plan, reporting its grads and
    params as flat pieces, as a rank does."""
    plan, cfg = Plan(), make_config("tiny", layers=1)
    ref, fake = Reference(plan, cfg), Reference(plan, cfg)
    lines = []
    for step in range(steps):
        loss, grads = fake.forward_backward()
        params = {n: t.clone() for n, t in fake.update().items()}
        if perturb_param and step == perturb_param[0]:
            params[perturb_param[1]].reshape(-1)[0] += 1e-4
        items = [{"loss": loss, "grad_pieces": _flat_pieces(grads), "param_pieces": _flat_pieces(params)}]
        line = {"loss": loss}
        lines.append((check_step(ref, items, line, "fp32"), line))
    return lines


def test_each_step_is_checked_at_the_plans_params():
    lines = _plan_side(steps=3)
    assert [failed for failed, _ in lines] == [False] * 3
    assert all(ln["max_abs_grad_err"] == 0 and ln["max_abs_param_err"] == 0 for _, ln in lines)


def test_a_wrong_update_fails_on_params_and_names_the_tensor():
    name = "layers.0.mlp.w2.weight"
    (failed0, _), (failed1, line) = _plan_side(steps=2, perturb_param=(1, name))
    assert not failed0 and failed1
    assert line["max_abs_param_err"] == pytest.approx(1e-4, rel=1e-3)
    assert "param" in line["check"] and name in line["check"]
