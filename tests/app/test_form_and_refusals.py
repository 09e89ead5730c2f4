"""Issue 35 item 6, the form and the refusals: the setup form is generated from the Plan's
FieldSpecs (form=) and now sets sp, fb-overlap, dtype and top-k, with every model preset
(deepseek-tiny too); a bool field reads on / off in one place (FieldSpec.parse), so `sp=banana` is
refused, not False; more ranks than cores is warned of; `trace save` into a folder that cannot be
written names that path and a save that works, and keeps the recording for it."""
import os

import pytest

from app_helpers import command, engine_ready, idle, launched, notifications, wait_for
from partui.app.screens import setup
from partui.app.widgets.command_line import CommandError, parse
from planning import mesh
from planning.config import PRESETS as MODEL_PRESETS
from planning.mesh import PlanError

pytestmark = pytest.mark.timeout(200)


def test_a_bool_field_reads_on_or_off_and_nothing_else():
    sp = next(s for s in mesh.field_specs() if s.name == "sp")
    assert [sp.parse(w) for w in ("on", "ON", "true", "yes", "1")] == [True] * 5
    assert [sp.parse(w) for w in ("off", "false", "no", "0")] == [False] * 4
    with pytest.raises(PlanError, match=r"sp 'banana' is neither on nor off: use `sp=on` or `sp=off`"):
        sp.parse("banana")
    with pytest.raises(CommandError, match=r"`sp=on` or `sp=off`"):
        parse("plan tp-sp sp=banana")
    assert parse("plan tp-sp sp=off").args["fields"] == {"sp": False}
    assert parse("plan gshard top-k=1 fb-overlap=on").args["fields"] == {"top_k": 1,
                                                                          "fb_overlap": True}


def test_the_cores_warning():
    assert setup.cores_warning(2, cores=2) == ""
    said = setup.cores_warning(8, cores=2)
    assert said.startswith("8 ranks on 2 cores") and "at most 2 ranks" in said


async def test_the_form_sets_every_form_field_and_warns_of_crowded_cores(monkeypatch):
    from partui.app.main import PartuiApp
    from textual.widgets import Input, Select
    monkeypatch.setattr(setup, "usable_cpus", lambda: 2)
    app = PartuiApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await engine_ready(app, pilot)
        form = app.setup_screen
        names = [s.name for s in setup.form_specs()]
        assert {"sp", "fb_overlap", "dtype", "top_k"} <= set(names)
        for name in names:                              # a widget for each FieldSpec shown
            form.query_one(f"#f-{name}")
        models = form.query_one("#f-model", Select)
        assert [v for _, v in models._options] == list(MODEL_PRESETS) and "deepseek-tiny" in MODEL_PRESETS
        form.query_one("#f-tp", Input).value = "2"
        form.query_one("#f-sp", Select).value = True
        form.query_one("#f-dtype", Select).value = "bf16"
        await pilot.pause(0.3)
        form.revalidate()
        assert not form.error and form.plan.sp and form.plan.dtype == "bf16", form.error
        status = str(form.query_one("#status").render())
        assert "✓ valid: custom · 2 ranks · tp 2 · sp" in status and "ranks on 2 cores" not in status
        for name, value in (("dp", "2"), ("ep", "2"), ("experts", "4"), ("top_k", "1")):
            form.query_one(f"#f-{name}", Input).value = value
        form.query_one("#f-tp", Input).value = "1"
        form.query_one("#f-sp", Select).value = False
        form.query_one("#f-dtype", Select).value = "fp32"
        models.value = "deepseek-tiny"
        await pilot.pause(0.3)
        form.revalidate()
        assert not form.error and form.plan.top_k == 1 and form.cfg.moe == "deepseek", form.error
        form.query_one("#f-dp", Input).value = "4"
        await pilot.pause(0.3)
        form.revalidate()
        status = str(form.query_one("#status").render())
        assert "! 4 ranks on 2 cores" in status, status
        await pilot.press("ctrl+c")


async def test_trace_save_into_an_unwritable_folder_names_it_and_keeps_the_recording(tmp_path):
    from partui.app.main import PartuiApp
    app = PartuiApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await launched(app, pilot, "plan single")
        seen = notifications(app)
        await pilot.press("t")
        await idle(app, pilot, "trace on")
        await pilot.press("s")
        await wait_for(pilot, lambda: app.world.steps_done == 1, what="a traced step")
        await idle(app, pilot)
        await command(app, pilot, "trace save /proc/x")
        await idle(app, pilot, "the refused save")
        msg, severity = seen[-1]
        assert severity == "error" and msg.startswith("cannot write the trace to /proc/x.json: "), msg
        assert "the recording is kept" in msg and "`trace save NAME` writes " in msg
        assert ".tmp" not in msg and "tmp" not in msg.split(":")[0]
        good = str(tmp_path / "kept.json")
        await command(app, pilot, f"trace save {good}")   # the fix the message names works
        await wait_for(pilot, lambda: app.world.trace_path == good, what="the second save")
        await idle(app, pilot, "the report")
        assert os.path.isfile(good)
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, timeout=20, what="q to quit")
