"""The Memory tab: each rank's memory account at its peak of the last step, stacked by kind (one
bar a rank, one letter a kind, scaled to the largest peak; the highest rank marked), with the
action at the peak. Every figure is the step line's `memory` (kernels/memory.py; `partui run
--json` prints the same, `partui report --memory` reads it from a trace)."""
from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from planning.memory_kinds import KINDS

MIB = 2 ** 20
WIDTH = 40
# a letter and a colour for each of planning.memory_kinds.KINDS (a test holds every kind styled)
STYLE = {"params": ("P", "blue"), "grads": ("G", "yellow"), "optimizer": ("O", "green"),
         "workspace": ("w", "red"), "activations": ("A", "magenta"), "gathered": ("g", "cyan"),
         "comm": ("c", "white")}


def bar(kinds: dict, scale: float) -> list[tuple[str, str]]:
    """(letters, style) per kind: each kind's share of WIDTH at `scale` bytes a full bar."""
    return [(STYLE[k][0] * round(kinds.get(k, 0) / scale * WIDTH), STYLE[k][1]) for k in KINDS
            if scale and kinds.get(k, 0)]


def render(history: list[dict]) -> Text:
    lines = [ln for ln in history if ln.get("memory")]
    out = Text()
    if not lines:
        out.append("no step has run yet: each rank's memory shows after its first step")
        return out
    last = lines[-1]
    ranks = [(r, m) for r, m in enumerate(last["memory"]) if m]
    top = max(m["peak"] for _, m in ranks)
    out.append(f"step {last['step']}: bytes each rank holds at its peak, by kind ("
               + " ".join(f"{STYLE[k][0]} {k}" for k in KINDS) + f"); a full bar {top / MIB:.2f} "
               "MiB\n", style="bold")
    for r, m in ranks:
        out.append(f"rank {r:<3} ")
        for letters, style in bar(m["peak_kinds"], top):
            out.append(letters, style=style)
        out.append(f" {m['peak'] / MIB:.2f} MiB at {m['peak_at']}, "
                   f"{m['peak_activation_entries']} microbatch contexts at most")
        out.append("  ◀ highest\n" if m["peak"] == top else "\n", style="bold")
    return out


class MemoryMap(Static):
    """The Memory tab: redrawn from the world's step lines after each step."""

    def show(self, history: list[dict]) -> None:
        self.shown = render(history)
        self.update(self.shown)
