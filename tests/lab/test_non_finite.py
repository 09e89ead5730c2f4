"""nan and inf never get in: a float Plan field refuses them by its own metadata (every comparison
with nan is False, so a range alone lets it through), and so do --link and simulate's costs."""
import pytest

from partui.cli import main
from planning.link import parse_link
from planning.mesh import Plan, PlanError


@pytest.mark.parametrize("fields,words", [
    ({"experts": 4, "ep": 2, "dp": 2, "capacity_factor": float("nan")}, "capacity factor nan is not a finite number"),
    ({"experts": 4, "ep": 2, "dp": 2, "capacity_factor": float("inf")}, "capacity factor inf is not a finite number"),
    ({"dp": 2, "bucket_mb": float("nan")}, "bucket size nan is not a finite number: set bucket_mb=4.0"),
    ({"dp": 2, "bucket_mb": float("inf")}, "bucket size inf is not a finite number"),
    ({"moe": "deepseek", "experts": 4, "route_scale": float("nan")}, "route_scale nan is not a finite number"),
    ({"moe": "deepseek", "experts": 4, "seq_aux_alpha": float("nan")}, "seq_aux_alpha nan is not a finite"),
    ({"moe": "deepseek", "experts": 4, "bias_gamma": float("inf")}, "bias_gamma inf is not a finite"),
])
def test_nan_and_inf_are_refused_by_the_fields_own_metadata(fields, words):
    """A float field's range check cannot see nan (every comparison is False): FieldSpec refuses
    any non-finite number, offering a number the field takes."""
    with pytest.raises(PlanError) as e:
        Plan(**fields)
    assert words in str(e.value)


@pytest.mark.parametrize("argv,words", [
    (["simulate", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--cost", "F=nan"],
     "cost F=nan must be a finite number >= 0"),
    (["simulate", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--parts", "ATTN=inf,MLP=1,A2A=1"],
     "parts ATTN=inf must be a finite number >= 0"),
])
def test_simulate_refuses_non_finite_costs(argv, words, capsys):
    assert main(argv) == 2
    assert words in capsys.readouterr().err


def test_a_non_finite_link_is_refused():
    with pytest.raises(ValueError, match="alpha_us must be a finite number"):
        parse_link("alpha_us=inf,gbps=1")
    with pytest.raises(ValueError, match="finite"):
        parse_link("alpha_us=1,gbps=nan")
