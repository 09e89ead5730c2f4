"""A per-rank text timeline of a recorded trace: one row of F / B / W / optimizer cells per rank
(the microbatch digit when the span has one), comm in flight as a thin bar under it, idle '·'."""
from __future__ import annotations

from rich.text import Text

STYLES = {"F": "black on #9ecae1", "B": "white on #2171b5", "W": "black on #969696",
          "FB": "black on #74c476", "optimizer": "black on #fdae6b"}
LETTERS = {"F": "F", "B": "B", "W": "W", "FB": "f", "optimizer": "o"}


def outermost(comp):
    """Compute spans not nested inside an earlier one (layer spans sit inside their F / B)."""
    comp = comp.sort_values(["rank", "ts"])
    prev_end = comp.groupby("rank")["end"].transform(lambda e: e.cummax().shift())
    return comp[~(comp["ts"] < prev_end)]


def render(df, width: int = 60, step: int | None = None) -> Text:
    """`df` from partui.analysis.figures.metrics.load; `step` limits it to one step's window."""
    if step is not None:
        st = df[(df["kind"] == "step") & (df["step"] == step)]
        if len(st):
            df = df[(df["ts"] < st["end"].max()) & (df["end"] > st["ts"].min())]
    if not len(df):
        return Text("empty trace", style="dim")
    t0, t1 = df["ts"].min(), df["end"].max()
    span = max(t1 - t0, 1e-9)
    comp = outermost(df[df["kind"] == "compute"])
    comm = df[df["kind"] == "comm"]
    out = Text()
    for r in sorted(df["rank"].unique()):
        row = [("·", "dim")] * width
        for ev in comp[comp["rank"] == r].itertuples():
            a = int((ev.ts - t0) / span * width)
            b = max(a + 1, int((ev.end - t0) / span * width))
            cat = str(ev.cat)
            mb = getattr(ev, "mb", None)
            ch = str(int(mb) % 10) if mb == mb and mb is not None else LETTERS.get(cat, "c")
            for c in range(a, min(b, width)):
                row[c] = (ch, STYLES.get(cat, "black on #c7e9c0"))
        bar = [" "] * width
        for ev in comm[comm["rank"] == r].itertuples():
            a = int((ev.ts - t0) / span * width)
            b = max(a + 1, int((ev.end - t0) / span * width))
            for c in range(a, min(b, width)):
                bar[c] = "▔"
        out.append(f"r{r:<2}│")
        for ch, style in row:
            out.append(ch, style=style)
        out.append("\n   │")
        out.append("".join(bar), style="#e6550d")
        out.append("\n")
    out.append(f"    {span / 1e3:.1f} ms · F light B dark W grey f fused F+B o optimizer · "
               f"comm in flight ▔ · idle ·", style="dim")
    return out
