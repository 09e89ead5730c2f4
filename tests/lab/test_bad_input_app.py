"""The bad-input table, third part: the app's command line (`:` then a command) refuses a bad line
with one message naming the problem and the right form (CommandError from the grammar, PlanError
from the plan its fields make); and the count over every bad-input table, printed and held at 250
or more (issue 35's closing note quotes it: `pytest -s -k count`)."""
import pytest

from partui.app.widgets.command_line import CommandError, parse
from partui.world.plans import build_plan
from test_bad_input import BAD_INPUTS, RUN_BAD
from test_bad_input_more import MORE_INPUTS

GRAMMAR_BAD = [  # (the line typed after `:`, words the message holds)
    ("", "empty command: try `step 1` or `help`"),
    ("   ", "empty command"),
    (":", "empty command"),
    ("fly", "unknown command 'fly': pick one of plan, launch, step"),
    ("plan", "plan needs a preset: e.g. `plan zero2 dp=2`"),
    ("plan dp dp", "plan field 'dp' needs key=value, e.g. dp=2"),
    ("plan dp foo=2", "unknown plan field 'foo': use one of world, dp"),
    ("plan dp =3", "unknown plan field ''"),
    ("plan dp dp=x", "dp 'x' is not a whole number: e.g. `dp=3`"),
    ("plan dp bucket_mb=x", "bucket_mb 'x' is not a number: e.g. `bucket_mb=1.25`"),
    ("plan dp capacity_factor=abc", "capacity_factor 'abc' is not a number"),
    ("plan dp top_k=1.5", "top_k '1.5' is not a whole number"),
    ("plan dp layers=two", "layers 'two' is not a whole number"),
    ("step x", "step 'x' is not a whole number: e.g. `step 3`"),
    ("step 0", "step 0: the number of steps must be >= 1"),
    ("step -3", "step -3: the number of steps must be >= 1"),
    ("run -1", "run -1: the number of steps must be >= 1"),
    ("run many", "run 'many' is not a whole number"),
    ("show", "show needs a rank: `show rank 2 grad layers.1.attn.wq`"),
    ("show 2", "show needs a rank"),
    ("show rank", "show needs a rank"),
    ("show node 1", "show needs a rank"),
    ("show rank x", "rank 'x' is not a whole number"),
    ("trace", "trace needs on, off or save NAME: e.g. `trace on`"),
    ("trace maybe", "trace needs on, off or save NAME"),
    ("trace start", "trace needs on, off or save NAME"),
    ("link", "link needs a preset, a spec or off"),
    ("link h800 foo=1", "link takes ranks_per_node=N after the link, not 'foo=1'"),
    ("link h800 2", "link takes ranks_per_node=N after the link, not '2'"),
    ("link h800 ranks_per_node=x", "ranks_per_node 'x' is not a whole number"),
    ("slow", "slow needs R=F, stage S=F or off"),
    ("slow stage", "slow needs R=F, stage S=F or off"),
    ("slow 1=2 2=3", "slow needs R=F, stage S=F or off"),
    ("slow x", "slow 'x': give WHO=FACTOR, e.g. slow 1=1.5"),
    ("slow 1=abc", "the factor 'abc' is not a number"),
    ("slow a=2", "the rank 'a' is not a whole number"),
    ("slow stage x=2", "the stage 'x' is not a whole number"),
    ("slow stage 0", "slow stage '0': give WHO=FACTOR"),
    ("slow 1=0.5", "the factor 0.5 must be >= 1"),
    ("slow 1=nan", "the factor nan must be >= 1"),
]

PLAN_BAD = [  # (`plan custom` fields as the app's command line gives them, words of the PlanError)
    ({"dp": -1}, "dp -1 must be >= 0: pick dp in 1, 2, 4, 8"),
    ({"tp": 3}, "tp 3 does not divide 4 heads: pick tp in 1, 2, 4"),
    ({"schedule": "foo"}, "(the schedule choices: gpipe, 1f1b, interleaved, zb1p, dualpipe, dualpipev)"),
    ({"pp": 3}, "set layers=6 or pp=2"),
    ({"zero": 2}, "set dp=2 or dp=4 or zero=0"),
    ({"bucket_mb": float("nan")}, "bucket size nan is not a finite number: set bucket_mb=4.0"),
    ({"sp": True}, "set tp=2 or tp=4 or sp=False"),
    ({"cp_mode": "star", "cp": 2}, "pick cp_mode in ring, zigzag, ulysses"),
    ({"experts": 4, "capacity_factor": 0.0}, "capacity factor 0.0 must be > 0: set capacity_factor=1.0"),
]


@pytest.mark.parametrize("line,words", GRAMMAR_BAD, ids=[repr(a) for a, _ in GRAMMAR_BAD])
def test_a_bad_command_line_names_the_problem_and_the_form(line, words):
    with pytest.raises(CommandError) as e:
        parse(line)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("fields,words", PLAN_BAD, ids=[str(f) for f, _ in PLAN_BAD])
def test_a_bad_plan_on_the_command_line_names_a_fix(fields, words):
    with pytest.raises(ValueError) as e:
        build_plan("custom", "tiny", None, **fields)
    assert words in str(e.value) and "\n" not in str(e.value)


def all_bad_inputs() -> list[str]:
    """Every bad input of the tables, as typed: CLI argv, `run` rows, `:` lines, `:plan` fields."""
    return ([a for a, _ in BAD_INPUTS] + [a for a, _ in MORE_INPUTS]
            + ["run " + " ".join(a) for a, _ in RUN_BAD]
            + [":" + line for line, _ in GRAMMAR_BAD]
            + [":plan custom " + " ".join(f"{k}={v}" for k, v in f.items()) for f, _ in PLAN_BAD])


def test_count_the_bad_inputs_at_least_250_distinct():
    typed = all_bad_inputs()
    distinct = set(typed)
    print(f"\nbad inputs: {len(distinct)} distinct ({len(BAD_INPUTS)} + {len(MORE_INPUTS)} CLI, "
          f"{len(RUN_BAD)} run with their fix run, {len(GRAMMAR_BAD)} + {len(PLAN_BAD)} app "
          f"command line), each refused with one line and no traceback")
    cli = [a for a, _ in BAD_INPUTS + MORE_INPUTS]
    assert len(set(cli)) == len(cli), sorted(a for a in set(cli) if cli.count(a) > 1)  # no row twice
    assert len(distinct) >= 250, len(distinct)
