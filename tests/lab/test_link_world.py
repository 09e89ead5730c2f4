"""The emulated link through partui.World: installed at launch, stated in the summary and the trace
metadata, switched between steps (a preset calibrated), removed; the app's `link` command."""
import json

import pytest

from partui.app.widgets.command_line import CommandError, parse
from partui.world.world import World


def test_world_link_is_stated_and_switches_between_steps(tmp_path):
    with World(timeout_s=120, link="alpha_us=1000,gbps=0.05") as w:
        w.plan("custom", layers=1, dp=2)
        w.launch()
        assert w.link["name"] == "alpha_us=1000,gbps=0.05" and w.link["factor"] == 1
        w.trace_on()
        w.step(1)
        path = w.trace_save(str(tmp_path / "t.json"))
        meta = json.load(open(path))["metadata"]
        assert meta["link"]["intra"] == {"alpha_us": 1000.0, "gbps": 0.05}
        s = w.summary()
        assert s["link"]["describe"].startswith("alpha_us=1000,gbps=0.05")
        held = s["mean_step_ms"]
        # at least the loss all-reduce's 2 latencies of 1 ms each were held
        assert held >= 2.0
        link = w.set_link("h800")
        assert link["name"] == "h800" and link["factor"] > 1 and link["cpu_flops"] > 0
        assert "h800 scaled" in w.link_text()
        assert w.set_link(None) is None and w.link_text() == "no emulated link"
        w.step(1)
        with pytest.raises(ValueError, match="link=h9"):
            w.set_link("h9")


def test_app_link_command_parses():
    assert parse("link h800 ranks_per_node=2").args == {"text": "h800", "ranks_per_node": 2}
    assert parse("link off").args == {"text": None, "ranks_per_node": None}
    assert parse("link alpha_us=5,gbps=1").args["text"] == "alpha_us=5,gbps=1"
    with pytest.raises(CommandError, match="link needs"):
        parse("link")
    with pytest.raises(CommandError, match="ranks_per_node=N"):
        parse("link h800 nodes=2")


def test_bench_ep_rejects_a_bad_link_before_launching(cli_here):
    p = cli_here("bench", "ep", "--link", "h800", "--ranks-per-node", "3")
    assert p.returncode == 2 and "--ranks-per-node 3 must be >= 1 and divide world 2" in p.stderr


def test_bench_whatif_rejects_unknown_plans(cli_here):
    p = cli_here("bench", "whatif", "--plans", "dp9")
    assert p.returncode == 2 and "unknown plans ['dp9']" in p.stderr
