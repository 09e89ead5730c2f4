"""The app's Memory tab: a pipeline world stepped in the app draws each rank's peak stacked by
kind from the same step lines `partui run --json` prints, redrawn every step."""
import pytest

from partui.app.widgets.memory_map import MIB, STYLE, WIDTH, bar, render
from planning.memory_kinds import KINDS
from app_helpers import idle, launched
from test_app import SIZE, assert_no_process

pytestmark = pytest.mark.timeout(300)


def test_every_kind_the_account_counts_has_a_letter_of_its_own():
    assert set(STYLE) == set(KINDS)
    assert len({letter for letter, _ in STYLE.values()}) == len(KINDS)


def test_bars_scale_each_kind_to_the_largest_peak():
    kinds = {"params": MIB, "activations": 3 * MIB}
    assert bar(kinds, 4 * MIB) == [("P" * (WIDTH // 4), "blue"), ("A" * (3 * WIDTH // 4), "magenta")]
    line = {"step": 0, "memory": [{"peak": 4 * MIB, "peak_at": "F(mb 1, chunk 0)", "peak_kinds": kinds,
                                   "peak_activation_entries": 2},
                                  {"peak": 2 * MIB, "peak_at": "BW(mb 0, chunk 0)",
                                   "peak_kinds": {"params": 2 * MIB}, "peak_activation_entries": 1}]}
    shown = str(render([line]))
    assert "a full bar 4.00 MiB" in shown
    assert f"rank 0   {'P' * (WIDTH // 4)}{'A' * (3 * WIDTH // 4)} 4.00 MiB at F(mb 1, chunk 0)" in shown
    assert f"rank 1   {'P' * (WIDTH // 2)} 2.00 MiB" in shown
    assert shown.count("◀ highest") == 1 and "no step" in str(render([]))


async def test_pipeline_world_draws_its_memory_every_step():
    from partui.app.main import PartuiApp
    from partui.app.widgets.inspector import TABS, Inspector
    from partui.app.widgets.memory_map import MemoryMap
    app = PartuiApp()
    async with app.run_test(size=SIZE) as pilot:
        pids = await launched(app, pilot, "plan 1f1b")
        await pilot.press("escape")              # leave the command line: `s` is a key, not text
        app.screen.query_one(Inspector).active = TABS["memory"]
        for step in range(2):
            await pilot.press("s")
            await pilot.pause(0.05)
            await idle(app, pilot, "a step")
            await pilot.pause(0.2)
            shown = str(app.screen.query_one(MemoryMap).shown)
            lines = app.world.history
            assert shown == str(render(lines)) and f"step {step}:" in shown
        for r, m in enumerate(lines[-1]["memory"]):
            assert f"rank {r}" in shown and f"{m['peak'] / MIB:.2f} MiB at {m['peak_at']}" in shown
        await pilot.press("escape", "q")
    assert_no_process(pids)
