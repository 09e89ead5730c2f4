"""The app's `slow` command (issue 27): its grammar (`slow R=F`, `slow stage S=F`, `slow off`,
clear errors showing the form), and typed between steps it slows that rank's next steps through
World.slow, says so, the Trace tab of a traced step names rank 1 and leads its blame table with it,
and `slow off` clears it; a rank outside the world is an error notification."""
import pytest

from app_helpers import command, idle, launched, notifications, trace_one_step, wait_for
from partui.app.widgets.command_line import EXAMPLES, CommandError, CommandSuggester, parse

pytestmark = pytest.mark.timeout(200)


def test_slow_grammar():
    assert parse("slow 1=1.5").args == {"rank": 1, "factor": 1.5}
    assert parse(":slow stage 0=2").args == {"stage": 0, "factor": 2.0}
    assert parse("slow off").args == {}
    for bad, needle in (("slow", "slow needs R=F, stage S=F or off"),
                        ("slow 1", "slow '1': give WHO=FACTOR, e.g. slow 1=1.5"),
                        ("slow stage", "slow needs R=F"),
                        ("slow stage 0", "slow stage '0': give WHO=FACTOR, e.g. slow stage 1=1.5"),
                        ("slow one=2", "rank 'one' is not a whole number"),
                        ("slow 1=fast", "the factor 'fast' is not a number"),
                        ("slow 1=0.5", "slow 1=0.5: the factor 0.5 must be >= 1"),
                        ("slow -1=2", "slow -1=2: the rank -1 must be >= 0")):
        with pytest.raises(CommandError, match=needle):
            parse(bad)
    assert {"slow 1=1.5", "slow stage 0=2", "slow off"} <= set(EXAMPLES)
    assert CommandSuggester([], lambda: []).matches("slow st") == ["stage"]


async def test_slow_between_steps():
    from partui.app.main import PartuiApp
    app = PartuiApp()
    async with app.run_test(size=(120, 40)) as pilot:
        await launched(app, pilot, "plan zero2 dp=2")
        seen = notifications(app)
        await command(app, pilot, "slow 1=3")
        await idle(app, pilot, "slow")
        assert app.world.slowed == {"rank": 1, "factor": 3.0}
        await wait_for(pilot, lambda: seen, what="the slow notification")
        assert seen[-1] == ("slow: rank 1's compute runs 3x as long from the next step", None)
        panel = await trace_one_step(app, pilot)      # the Trace tab names it, with the table
        line = panel.query_one("#saved-line")
        await wait_for(pilot, lambda: "worst worker" in str(line.render()), what="the blame table")
        text = str(line.render())
        assert text.startswith("blame: rank 1 is the slowest worker")
        assert [ln.split()[:3] for ln in text.splitlines() if ln.startswith("worst worker")] == \
            [["worst", "worker", "1"]]
        seen.clear()
        await command(app, pilot, "slow 5=2")
        await idle(app, pilot, "slow 5")
        await wait_for(pilot, lambda: any(sev == "error" for _, sev in seen), what="the error")
        assert any("rank 5 is outside 0..1" in msg and sev == "error" for msg, sev in seen)
        assert app.world.slowed == {"rank": 1, "factor": 3.0}
        await command(app, pilot, "slow off")
        await idle(app, pilot, "slow off")
        assert app.world.slowed == {}
        await pilot.press("escape", "q")
