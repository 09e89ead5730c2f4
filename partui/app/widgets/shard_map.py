"""How one parameter's global tensor is split across all ranks: a bar per rank over the
flattened tensor, filled where that rank holds elements, with the slice or flat range."""
from __future__ import annotations

import math

from rich.text import Text
from textual.widgets import Static

from partui.world.tables import piece_label

COLORS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")


def holds(kind: str, index, shape, flat_i: int) -> bool:
    """Does a piece hold element flat_i of the global tensor (row-major)?"""
    if index is None:
        return True
    if kind == "flat":
        return index[0] <= flat_i < index[1]
    for n, (a, b) in zip(reversed(shape), reversed(index)):
        flat_i, c = divmod(flat_i, n)
        if not a <= c < b:
            return False
    return True


def grad_snaps(snaps: list[dict]) -> list[dict]:
    """Each rank's gradient pieces in the shape render reads (s["grads"]): a param's grad piece
    (partui.world.snapshot) where the rank holds one."""
    return [{"rank": s["rank"],
             "grads": [dict(p["grad_piece"], name=p["name"], global_shape=p["global_shape"])
                       for p in s["params"] if p.get("grad_piece")]} for s in snaps]


def render(name: str, snaps: list[dict], width: int = 32, what: str = "params") -> Text:
    """One line per rank; `what` is "params", "grads" or "optimizer" (ZeRO shards them apart)."""
    out = Text()
    shape = None
    for s in snaps:
        for p in s[what]:
            if p["name"] == name:
                shape = p["global_shape"]
    if shape is None:
        return Text(f"no rank holds {name}", style="red")
    numel = math.prod(shape)
    out.append(f"{name} {list(shape)} · {numel} elements · {what}\n", style="bold")
    for s in snaps:
        pieces = [p for p in s[what] if p["name"] == name]
        out.append(f"r{s['rank']} ", style="bold")
        color = COLORS[s["rank"] % len(COLORS)]
        for c in range(width):
            mid = int((c + 0.5) * numel / width)
            on = any(holds(p["kind"], p["index"], shape, mid) for p in pieces)
            out.append("█" if on else "░", style=color if on else "dim")
        labels = [piece_label(p["kind"], p["index"], shape) for p in pieces] or ["—"]
        out.append(" " + " ".join(labels) + "\n")
    return out


class ShardMap(Static):
    def show(self, name: str, snaps: list[dict], what: str = "params") -> None:
        width = max(8, (self.size.width or 40) - 24)
        self.update(render(name, snaps, width, what))
