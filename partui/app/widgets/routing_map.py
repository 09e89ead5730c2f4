"""The routing observatory in the app: the current step's layer x expert heatmap (each cell the
expert's tokens over the layer's mean: darker = busier, a red x = a dead expert), a max-violation
sparkline over the steps so far, and the selection bias range. Every figure is the step line's
(`partui run --json` prints the same moe_layers; `partui report --routing` tabulates them)."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

SHADES = ("·", "░", "▒", "▓", "█")     # load / mean: < 0.5, < 0.9, < 1.1, < 1.5, >= 1.5
EDGES = (0.5, 0.9, 1.1, 1.5)
BARS = "▁▂▃▄▅▆▇█"
SPARK_STEPS = 40


def shade(tokens: int, mean: float) -> str:
    """The heatmap cell of an expert: its load over the mean load, bucketed by EDGES."""
    ratio = tokens / mean if mean else 0.0
    return SHADES[sum(ratio >= e for e in EDGES)]


def sparkline(values: list[float]) -> str:
    """One bar per value, scaled from 0 to the largest value."""
    top = max(values, default=0.0)
    return "".join(BARS[min(len(BARS) - 1, int(v / top * (len(BARS) - 1) + 0.5))] if top else BARS[0]
                   for v in values)


def render(history: list[dict]) -> Text:
    """The heatmap of the last step with routing figures, the sparkline of every such step."""
    lines = [ln for ln in history if "moe_layers" in ln]
    out = Text()
    if not lines:
        out.append("no MoE layer has run yet (a model with --experts, or --model deepseek-tiny)")
        return out
    last = lines[-1]
    out.append(f"step {last['step']}: tokens per expert over the layer's mean "
               f"({' '.join(SHADES)} = <0.5 <0.9 <1.1 <1.5 more; x dead)\n", style="bold")
    for index, fig in last["moe_layers"].items():
        tok = fig["tokens_per_expert"]
        mean = sum(tok) / len(tok)
        out.append(f"L{index:<3}")
        for n in tok:
            out.append(" x" if n == 0 else " " + shade(n, mean), style="bold red" if n == 0 else "")
        out.append(f"  max viol {fig['max_violation']:.3f}  dropped {fig['dropped']}")
        if fig["bias"]:
            out.append(f"  bias [{min(fig['bias']):+.4f}, {max(fig['bias']):+.4f}]")
        if fig["dead_experts"]:
            out.append(f"  dead {' '.join(map(str, fig['dead_experts']))}", style="bold red")
        out.append("\n")
    viol = [ln["moe_max_violation"] for ln in lines[-SPARK_STEPS:]]
    out.append(f"max violation, last {len(viol)} steps (max over layers): {sparkline(viol)} "
               f"{viol[-1]:.3f}")
    return out


class RoutingMap(Static):
    """The Routing tab: redrawn from the world's step lines after each step."""

    def show(self, history: list[dict]) -> None:
        self.shown = render(history)
        self.update(self.shown)
