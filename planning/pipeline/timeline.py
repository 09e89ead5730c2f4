"""The schedule grid of a simulated step as text: a row per rank, a cell per time quantum (`partui simulate`)."""
from __future__ import annotations

from planning.pipeline.catalog import formula_bubble
from planning.pipeline.simulate import SimResult

_ANSI = {("F", 0): "38;5;117", ("F", 1): "38;5;222", ("B", 0): "1;38;5;27", ("B", 1): "1;38;5;166",
         ("W", 0): "38;5;245", ("W", 1): "38;5;245", ("FB", 0): "1;38;5;135", ("FB", 1): "1;38;5;135"}


# a cell's letter by action kind (kinds=True): distinct without colour; BW is the whole backward
GLYPH = {"F": "F", "B": "B", "BW": "B", "W": "W", "FB": "&"}
GLYPH_LEGEND = "cells: F forward, B backward, W weight grads, & an F&B pair, then the microbatch; · idle"


def text_timeline(result: SimResult, width: int = 160, color: bool = False, kinds: bool = False) -> str:
    """The schedule grid: a row per rank, a cell per time quantum holding the microbatch of the action that runs
    then ('·' idle; kinds: led by its kind's letter, GLYPH, with a legend row), and a legend line with the
    largest bubble, the published formula and activations held."""
    s = result.schedule
    durations = [e - b for spans in result.spans for b, e, _ in spans if e > b]
    cell = len(str(s.microbatches - 1)) + 1 + kinds
    quantum = min(durations) if durations else 1.0
    quantum = max(quantum, result.makespan / max(1, width // cell))   # at most `width` characters a row
    columns = int(round(result.makespan / quantum + 0.4999)) if result.makespan else 0
    label = len(str(s.pp - 1))
    rows = []
    for r, spans in enumerate(result.spans):
        cells, j = [], 0
        for c in range(columns):
            mid = (c + 0.5) * quantum
            while j < len(spans) and spans[j][1] <= mid:
                j += 1
            if j < len(spans) and spans[j][0] <= mid:
                a = spans[j][2]
                text = (GLYPH.get(a.kind, a.kind[0]) * kinds + str(a.mb)).rjust(cell)
                if color:
                    kind = "FB" if a.kind == "FB" else "B" if a.kind == "BW" else a.kind
                    direction = s.direction_of(a.mb) if s.directions == 2 else int(a.chunk > 0)
                    text = f"\x1b[{_ANSI[(kind, direction)]}m{text}\x1b[0m"
            else:
                text = "·".rjust(cell)
            cells.append(text)
        rows.append(f"rank {str(r).rjust(label)} │" + "".join(cells))
    formula, text = formula_bubble(s.name, s.pp, result.cost, s.chunks_per_rank)   # v: virtual ones only
    pct = 100 * result.bubble / result.makespan if result.makespan else 0.0
    rows.append(f"{' ' * (label + 6)} bubble {result.bubble:g} = {pct:.1f}% (rank {result.bubble_rank}) · formula "
                f"{text} = {formula:g} · activations held ≤ {max(result.peak_activations)}"
                + (" · F light, B dark, W grey, FB purple, 2nd direction/chunk warm" if color else ""))
    if kinds:
        rows.append(f"{' ' * (label + 6)} {GLYPH_LEGEND}")
    return "\n".join(rows)
