"""Each lab idea written once (issue 32): the straggler text "R=F" has one parser and one check
(planning.slow_spec), which the Plan's --slow-rank / --slow-stage, the app's `slow` and World.slow
read, each message starting with the setting as the user wrote it; `show`'s words for a kind have
one table (partui.world.show_kinds), which World.show and the app's `:show` read."""
import pytest

from partui.app.widgets.command_line import CommandError, parse
from partui.world.show_kinds import show_kind
from planning.field_spec import PlanError
from planning.mesh import Plan
from planning.slow_spec import check_slow, check_straggler, parse_slow


def test_one_parser_reads_r_equals_f():
    assert parse_slow("1=1.5", "slow_rank") == (1, 1.5)
    assert parse_slow("", "slow_stage") is None
    for spec, said, message in (
            ("1:2", "", "--slow-rank '1:2': give WHO=FACTOR, e.g. --slow-rank 1=1.5"),
            ("x=2", "", "--slow-rank 'x=2': the rank 'x' is not a whole number: give WHO=FACTOR, "
                        "e.g. --slow-rank 1=1.5"),
            ("1=fast", "slow", "slow '1=fast': the factor 'fast' is not a number: give WHO=FACTOR, "
                               "e.g. slow 1=1.5"),
            ("1=0.5", "slow", "slow 1=0.5: the factor 0.5 must be >= 1: a straggler runs its compute "
                              "factor >= 1 times as long, e.g. 1.5"),
            ("-1=2", "", "--slow-rank -1=2: the rank -1 must be >= 0")):
        with pytest.raises(PlanError) as got:
            parse_slow(spec, "slow_rank", said)
        assert str(got.value) == message and got.value.field == "slow_rank"


def test_the_app_and_the_plan_say_the_same_words():
    for spec in ("1=0.5", "one=2", "1=fast"):
        with pytest.raises(PlanError) as plan_said:
            parse_slow(spec, "slow_stage")
        with pytest.raises(CommandError) as app_said:
            parse(f"slow stage {spec}")
        assert str(app_said.value) == str(plan_said.value).replace("--slow-stage", "slow stage")


def test_one_check_bounds_the_index_by_its_dimension():
    with pytest.raises(PlanError, match=r"^--slow-stage 2=2: stage 2 is outside 0\.\.1 \(pp 2\): "
                                        r"pick a stage in 0\.\.1$"):
        check_slow(Plan(pp=2, microbatches=2, slow_stage="2=2"))
    with pytest.raises(PlanError, match=r"^slow\(rank=4, factor=2\): rank 4 is outside 0\.\.3 "
                                        r"\(world 4\): pick a rank in 0\.\.3$"):
        check_straggler("slow_rank", 4, 2.0, "slow(rank=4, factor=2)", 4)
    check_straggler("slow_rank", 3, 1.0, "slow(rank=3, factor=1)", 4)     # the last rank, unslowed


def test_show_reads_one_alias_table():
    assert [show_kind(w) for w in ("param", "grads", "optimizer", "shard", "grad", "trace")] == \
        ["params", "grad", "optim", "shards", "grad", "trace"]
    for word, kind in (("grads", "grad"), ("optimizer", "optim"), ("shard", "shards"), ("param", "params")):
        assert parse(f"show rank 1 {word} layers.0").args == {"rank": 1, "what": kind, "name": "layers.0"}
