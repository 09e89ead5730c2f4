"""The routing observatory: its arithmetic on hand-built counts with known answers, the one
all-reduce over dp that gathers it, and end to end: `--json`, `partui report --routing` and the
app's heatmap agree, and none of them changes with tp (the old per-rank sum counted every
figure tp times)."""
import json
import math

import pytest
import torch

from conftest import run_here
from kernels import comm
from planning.routing_figures import layer_figures, merge_layers, routing_totals
from kernels.ep.routing_load import ExpertLoad
from partui.analysis.figures.routing import routing_steps, routing_table
from partui.app.widgets.routing_map import render, shade, sparkline


def test_layer_figures_by_hand():
    # 4 experts on 2 EP ranks; 9 choices, 1 dropped over capacity at expert 0; expert 1 took none
    fig = layer_figures([4, 0, 2, 2], [5, 0, 2, 2], 0.25, [0.1, -0.2, 0.0, 0.0], ep=2)
    assert fig["tokens_per_expert"] == [4, 0, 2, 2]
    assert fig["tokens_per_ep_rank"] == [4, 4]                     # experts 0-1, experts 2-3
    assert fig["dropped"] == 1
    assert fig["max_violation"] == 1.0                             # max 4 / mean 2 - 1
    assert fig["dead_experts"] == [1]
    assert fig["bias"] == [0.1, -0.2, 0.0, 0.0] and fig["balance_loss"] == 0.25


def test_totals_and_merge_take_each_layer_once():
    a = layer_figures([4, 0, 2, 2], [5, 0, 2, 2], 0.25, None, ep=1)
    b = layer_figures([2, 2, 2, 2], [2, 2, 2, 2], 0.5, None, ep=1)
    # ranks 0, 1: tp replicas of stage 0 (layer 0); rank 2: stage 1 (layer 1)
    merged = merge_layers([{"0": a}, {"0": a}, {"1": b}, None])
    assert list(merged) == ["0", "1"]
    totals = routing_totals(merged)
    assert totals["moe_tokens_per_expert"] == [6, 2, 4, 4]
    assert totals["moe_dropped"] == 1 and totals["moe_dead_experts"] == 1
    assert totals["moe_aux_loss"] == 0.75 and totals["moe_max_violation"] == 1.0


def _gather(rank, size):
    torch.set_num_threads(1)
    dp = comm.new_groups("dp", [list(range(size))])
    load = ExpertLoad(lambda: [dp], ep=2)
    # rank r's tokens: expert r took 3 + r choices in layer 5, over two microbatches
    for _ in range(2):
        kept = torch.zeros(4, dtype=torch.int64)
        kept[rank] = 3 + rank
        chosen = kept.clone()
        chosen[rank] += rank == 1                                  # rank 1 lost a choice
        load.record(5, kept, chosen, 0.125)
    return load.take()


def test_one_all_reduce_over_dp_sums_every_ranks_counts(gloo_world):
    got = gloo_world(2, _gather, timeout_s=120)
    assert got[0] == got[1]
    fig = got[0]["moe_layers"]["5"]
    assert fig["tokens_per_expert"] == [6, 8, 0, 0]                # 2 microbatches x (3, 4)
    assert fig["chosen_per_expert"] == [6, 10, 0, 0] and fig["dropped"] == 2
    assert fig["balance_loss"] == 0.5                              # 2 ranks x 2 x 0.125
    assert fig["dead_experts"] == [2, 3] and fig["tokens_per_ep_rank"] == [14, 0]


def test_routing_table_and_app_render_by_hand():
    lines = [{"step": s, "moe_layers": {"0": layer_figures(tok, tok, 0.01, [0.0, 0.1, -0.1, 0.0], 2)},
              "moe_max_violation": layer_figures(tok, tok, 0, None, 2)["max_violation"]}
             for s, tok in ((0, [8, 0, 0, 0]), (1, [4, 2, 1, 1]), (2, [2, 2, 2, 2]))]
    table = routing_table({ln["step"]: ln["moe_layers"] for ln in lines})
    row = table.iloc[1]
    assert (row["tokens"], row["min"], row["max"]) == (8, 1, 4)
    assert math.isclose(row["std"], math.sqrt((4 + 0 + 1 + 1) / 4))   # mean 2
    assert row["max_violation"] == 1.0 and row["dead"] == "-" and table.iloc[0]["dead"] == "1 2 3"
    assert (row["bias_min"], row["bias_max"]) == (-0.1, 0.1)
    assert list(table.iloc[2][["e0", "e1", "e2", "e3"]]) == [2, 2, 2, 2]
    assert sparkline([3.0, 1.0, 0.0]) == "█▃▁" and shade(8, 2) == "█" and shade(2, 2) == "▒"
    text = str(render(lines))
    assert "L0   ▒ ▒ ▒ ▒  max viol 0.000" in text                   # step 2: level
    assert "max violation, last 3 steps (max over layers): █▃▁ 0.000" in text
    assert "dead" not in str(render(lines[2:])).split("\n")[1]
    assert "L0   █ x x x" in str(render(lines[:1])) and "dead 1 2 3" in str(render(lines[:1]))


def assert_same_routing(got: dict, want: dict):
    """Counts exactly; the balance loss, max violation and bias to fp32 rounding (tp sums the
    attention output in another order, so the router's inputs differ in the last bits)."""
    assert got.keys() == want.keys()
    for index, fig in want.items():
        for key, value in fig.items():
            if key in ("balance_loss", "max_violation"):
                assert got[index][key] == pytest.approx(value, rel=1e-5, abs=1e-9), (index, key)
            elif key == "bias" and value is not None:
                assert got[index][key] == pytest.approx(value, abs=1e-7), (index, key)
            else:
                assert got[index][key] == value, (index, key)


def _run_json(tmp_path, name, *args):
    trace = str(tmp_path / f"{name}.json")
    proc = run_here("run", *args, "--steps", 2, "--json", "--trace", trace,
                   check_rc=0)
    log = tmp_path / f"{name}.jsonl"
    log.write_text(proc.stdout)
    return [ln for ln in proc.lines if "step" in ln], trace, str(log)


@pytest.mark.timeout(900)
def test_json_report_and_app_agree_and_tp_changes_nothing(tmp_path):
    ds = ("--model", "deepseek-tiny", "--ep", 2, "--dp", 2)
    plain, trace, log = _run_json(tmp_path, "ds", *ds)
    with_tp, _, _ = _run_json(tmp_path, "ds-tp", *ds, "--tp", 2)
    for a, b in zip(plain, with_tp):
        assert_same_routing(a["moe_layers"], b["moe_layers"])
        for key in ("moe_tokens_per_expert", "moe_dropped", "moe_max_violation"):
            assert a[key] == b[key]
        assert sum(a["moe_tokens_per_expert"]) == 4 * 8 * 32 * 2    # layers x tokens x top-k
    assert plain[1]["moe_layers"]["0"]["bias"] != [0.0] * 8       # step 1 routes with a bias
    # the report reads the same figures from the trace and from the --json log
    assert routing_steps(trace) == routing_steps(log) == {ln["step"]: ln["moe_layers"]
                                                          for ln in plain}
    proc = run_here("report", trace, "--routing", "--format", "json", check_rc=0)
    doc = json.loads(proc.stdout)
    rows = doc["rows"]
    assert doc["definitions"]["max_violation"].startswith("--routing")
    assert len(rows) == 2 * 4
    for r in rows:
        fig = plain[r["step"]]["moe_layers"][str(r["layer"])]
        assert [r[f"e{i}"] for i in range(8)] == fig["tokens_per_expert"]
        assert r["max_violation"] == round(fig["max_violation"], 3)
        assert r["bias_max"] == round(max(fig["bias"]), 6)
    # the app's heatmap line of each layer quotes the same max violation
    text = str(render(plain))
    for index, fig in plain[-1]["moe_layers"].items():
        assert f"max viol {fig['max_violation']:.3f}  dropped {fig['dropped']}" in text


@pytest.mark.timeout(900)
def test_gshard_drops_are_no_longer_multiplied_by_tp():
    args = ("--experts", 4, "--ep", 2, "--dp", 2, "--top-k", 2, "--capacity-factor", 0.5,
            "--steps", 1, "--json")
    lines = {tp: run_here("run", *args, "--tp", tp, check_rc=0).lines[0]
             for tp in (1, 2)}
    assert lines[1]["moe_dropped"] > 0
    assert lines[2]["moe_dropped"] == lines[1]["moe_dropped"]
    assert_same_routing(lines[2]["moe_layers"], lines[1]["moe_layers"])
    tokens = sum(lines[1]["moe_tokens_per_expert"]) + lines[1]["moe_dropped"]
    assert tokens == 4 * 8 * 32 * 2                                 # every choice, once


def test_routing_report_refuses_a_file_without_routing(tmp_path):
    log = tmp_path / "dense.jsonl"
    log.write_text('{"step": 0, "loss": 5.0}\n')
    proc = run_here("report", str(log), "--routing", check_rc=2)
    assert "no routing figures" in proc.stderr and "--model deepseek-tiny" in proc.stderr


@pytest.mark.timeout(600)
def test_selection_bias_is_shown_as_state_beside_the_params():
    """The bias a snapshot shows after step n is the one step n + 1 routes with (its figures say so)."""
    from partui.world.world import World
    with World(timeout_s=300) as w:
        w.plan("deepseek", ep=2, dp=2)
        w.step(2)
        rows = w.show(1, "params", "selection_bias")
        assert rows and all(r["local_shape"] == r["global_shape"] == [8] for r in rows)
        shown = {r["name"]: r["value"]["values"] for r in rows}
        nxt = w.step(1)[0]["moe_layers"]
        for index, fig in nxt.items():
            assert shown[f"layers.{index}.moe.selection_bias"] == [round(b, 6) for b in fig["bias"][:4]]
        assert any(v != 0.0 for vals in shown.values() for v in vals)   # two updates moved it
