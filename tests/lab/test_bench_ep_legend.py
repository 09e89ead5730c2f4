"""`partui bench ep`'s legend says what "saved" counts, and whether the no-overlap plan's
all-to-all outweighs its expert compute (the condition the issue's saving is measured under)."""
from partui.bench.ep import VARIANTS, legend


def _rows(a2a_ms, expert_ms):
    return [{"a2a_ms": a2a_ms, "expert_ms": expert_ms} for _ in VARIANTS]


def test_legend_defines_saved_against_the_same_link():
    text = legend(_rows(150.0, 80.0), linked=True)
    assert ("step_ms of the same plan without overlap minus step_ms with it, both under the same "
            "link") in text
    assert "as a % of the no-overlap plan's a2a_ms" in text
    assert "a2a 150.0 ms is at least its expert compute 80.0 ms" in text


def test_legend_says_when_the_all_to_all_is_lighter_than_the_experts():
    text = legend(_rows(40.0, 80.0), linked=False)
    assert "a2a 40.0 ms is less than its expert compute 80.0 ms" in text
    assert "same link" not in text
