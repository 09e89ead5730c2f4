"""`Rows`: what World.step and World.show return. Still a list of the same plain dicts (the app,
`partui run --json` and scripts read them as before), but it prints as a compact table in the REPL
and converts to a pandas DataFrame. Light to import: pandas loads on `to_pandas()` only.

    >>> w.show(1, "optim")          # name  piece  optimizer_steps  m_norm  v_norm, one line per tensor
    >>> w.step(3).to_pandas()       # one row per step and rank: step, rank, loss, compute_ms, ...
"""
from __future__ import annotations

from collections.abc import Callable

from partui.world.results import FIGURE_KEYS, overlap_pct


def piece_label(kind: str, index, shape) -> str:
    """Where a piece sits in its global tensor: whole, a slice per dim, or a flat range (ZeRO)."""
    if index is None:
        return "whole"
    if kind == "flat":
        return f"flat [{index[0]}:{index[1]}]"
    dims = [":" if (a, b) == (0, n) else f"{a}:{b}" for (a, b), n in zip(index, shape)]
    return "[" + ", ".join(dims) + "]"


def fmt(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    return str(v)


class Rows(list):
    """A list of dicts with named columns: each column a function of one dict. `expand` turns one
    dict into the several a table shows for it (a step line: one per rank); `defined`: its columns
    are figures of partui.analysis.figures.definitions, whose words ride in the DataFrame's
    attrs["definitions"]."""

    def __init__(self, rows, columns: dict[str, Callable[[dict], object]], title: str = "",
                 expand: Callable[[dict], list[dict]] | None = None, defined: bool = False):
        super().__init__(rows)
        self.columns, self.title, self.expand, self.defined = columns, title, expand, defined

    def records(self) -> list[dict]:
        """One flat dict per row: the columns' values (what to_pandas holds)."""
        items = [x for r in self for x in self.expand(r)] if self.expand else list(self)
        return [{c: fn(x) for c, fn in self.columns.items()} for x in items]

    def to_pandas(self):
        # lazy: pandas costs ~0.5 s; a REPL that never converts never pays it
        import pandas as pd

        from partui.analysis.figures.definitions import definitions
        df = pd.DataFrame(self.records(), columns=list(self.columns))
        if self.defined:
            df.attrs["definitions"] = definitions(df.columns)
        return df

    def __repr__(self) -> str:
        records = self.records()
        cells = [list(self.columns)] + [[fmt(v) for v in rec.values()] for rec in records]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.columns))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
        head = [f"{self.title} ({len(records)} rows; .to_pandas() for a DataFrame)"] if self.title else []
        return "\n".join(head + lines)

    __str__ = __repr__


def _norm(key: str) -> Callable[[dict], object]:
    return lambda r: (r.get(key) or {}).get("norm")


def _piece(r: dict) -> str:
    return piece_label(r["kind"], r["index"], r["global_shape"])


def _rank_items(line: dict) -> list[dict]:
    """A step line as one dict per rank: the step's columns beside the rank's figures."""
    return [{**line, "rank": i, "window_ms": x["window_ms"], **{k: x[k] for k in FIGURE_KEYS}}
            for i, x in enumerate(line["ranks"])]


def step_rows(lines: list[dict], title: str = "steps") -> Rows:
    """Step lines (partui.world.results) as rows, one per step and rank: the rank's figures are the
    report's columns, counted as partui.analysis.figures.definitions says (planning.intervals.figures)."""
    cols = {"step": lambda r: r["step"], "rank": lambda r: r["rank"], "loss": lambda r: r["loss"],
            "step_ms": lambda r: r["step_ms"], "window_ms": lambda r: r["window_ms"]}
    cols.update({k: (lambda r, k=k: r[k]) for k in FIGURE_KEYS})
    cols["overlap_pct"] = overlap_pct
    if any("max_abs_grad_err" in ln for ln in lines):
        cols["max_abs_grad_err"] = lambda r: r.get("max_abs_grad_err")
    return Rows(lines, cols, title, expand=_rank_items, defined=True)


def show_rows(rows: list[dict], what: str, title: str = "") -> Rows:
    """A rank's params, grads or optimizer state (partui.world.snapshot) as rows."""
    cols: dict[str, Callable[[dict], object]] = {"name": lambda r: r["name"]}
    if what == "optim":
        cols.update({"piece": _piece, "optimizer_steps": lambda r: r["step"],
                     "m_norm": lambda r: (r["state"].get("m") or {}).get("norm"),
                     "v_norm": lambda r: (r["state"].get("v") or {}).get("norm")})
    elif what == "grad":
        cols.update({"grad_piece": lambda r: ("not held here" if r.get("grad_piece") is None
                                              else piece_label(r["grad_piece"]["kind"],
                                                               r["grad_piece"]["index"],
                                                               r["global_shape"])),
                     "norm": _norm("grad"),
                     "absmax": lambda r: (r.get("grad") or {}).get("absmax")})
    else:
        cols.update({"global_shape": lambda r: r["global_shape"],
                     "local_shape": lambda r: r["local_shape"], "piece": _piece,
                     "norm": _norm("value")})
    return Rows(rows, cols, title, defined=True)
