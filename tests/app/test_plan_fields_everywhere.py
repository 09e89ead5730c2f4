"""A Plan field added in one place, its metadata, shows up everywhere a plan is typed: `partui run
--help`, `partui plan`'s flags, the app's `:` command line and the setup form. A throwaway field is
added through planning.field_spec.plan_field on a Plan subclass, and the generators are pointed at it."""
import contextlib
import io
from dataclasses import make_dataclass

import pytest

from planning import mesh
from planning.field_spec import plan_field, specs_of
from planning.mesh import Plan, PlanError
from partui.app.widgets.command_line import CommandError, CommandSuggester, parse
from partui.cli import build_parser
from partui.commands.flags import FLAG_OF, fields_from_args
from partui.world.plans import build_plan

pytestmark = pytest.mark.timeout(300)
HELP = "a knob only this test adds"


@pytest.fixture
def throwaway(monkeypatch):
    """Plan plus one int field `throwaway_knob` (>= 1, default 3, last in the form)."""
    extended = make_dataclass("Extended", [("throwaway_knob", int, plan_field(
        3, HELP, dim="pp", ge=1, form=99))], bases=(Plan,), frozen=True)
    monkeypatch.setattr(mesh, "field_specs", lambda cls=None: specs_of(cls or extended))
    return extended


def _help(command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser(command).parse_args([command, "--help"])
    return " ".join(out.getvalue().split())


def test_a_new_field_reaches_the_flags_and_the_command_line(throwaway):
    assert f"--throwaway-knob N {HELP} (default 3)" in _help("run")
    assert "--throwaway-knob" in _help("plan")
    args = build_parser("plan").parse_args(["plan", "--throwaway-knob", "5"])
    assert fields_from_args(args) == {"throwaway_knob": 5}
    assert parse("plan custom throwaway_knob=5").args["fields"] == {"throwaway_knob": 5}
    with pytest.raises(CommandError, match="e.g. `throwaway_knob=3`"):
        parse("plan custom throwaway_knob=many")
    assert "throwaway_knob=" in CommandSuggester(["custom"], list).candidates(["plan", "custom", "thr"])
    # the field's own range is refused where the Plan is built, with a fix
    with pytest.raises(PlanError, match="throwaway_knob 0 must be >= 1: set throwaway_knob=3"):
        throwaway(throwaway_knob=0)


async def test_a_new_field_reaches_the_setup_form(throwaway):
    from textual.widgets import Input
    from partui.app.main import PartuiApp
    app = PartuiApp()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.2)
        knob = app.setup_screen.query_one("#f-throwaway_knob", Input)
        assert knob.value == "3"
        knob.value = "7"
        await pilot.pause()
        assert app.setup_screen.fields()["throwaway_knob"] == 7


def test_nothing_refuses_a_plan_field():
    """Every real Plan field: a flag, a word of the app's command line, and in FLAG_OF."""
    parser = build_parser("run")
    for spec in mesh.field_specs():
        value = spec.choices[-1] if spec.choices else {int: 2, float: 1.5, bool: True, str: "x"}[spec.kind]
        typed = {True: "on"}.get(value, value) if spec.kind is bool else value
        assert parse(f"plan custom {spec.name}={typed}").args["fields"] == {spec.name: value}
        flag = FLAG_OF[spec.name]
        args = parser.parse_args(["run", flag] if spec.kind is bool else ["run", flag, str(value)])
        assert fields_from_args(args)[spec.name] == value


def test_a_bad_field_is_refused_at_construction_with_fixes_that_validate():
    with pytest.raises(PlanError, match=r"unknown EP dispatch 'random' \(the EP dispatch choices: uneven, even\): pick ep_dispatch in uneven, even"):
        Plan(ep_dispatch="random")
    with pytest.raises(PlanError) as e:
        build_plan(world=-4, tp=2)        # world's valid sizes with tp 2 (0, derived, is no size to type)
    assert str(e.value) == "world -4 must be >= 0: pick world in 2, 4, 8, 16"
    assert e.value.fixes == [{"world": 2}, {"world": 4}, {"world": 8}, {"world": 16}]
    # microbatches follow the schedule (the Plan's default); interleaved would need virtual stages,
    # dualpipev 4 stages of the tiny model's 2 layers
    with pytest.raises(PlanError, match="pick schedule in gpipe, 1f1b, zb1p, dualpipe$"):
        build_plan(pp=2, schedule="warp")
