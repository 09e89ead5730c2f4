"""What `partui report` prints around its tables: how many rows (--rows: a long table's head, and a
line saying how many were left out), which terms its legend opens with (a CPU-only torch.profiler
trace is read by op names, not partui's spans), and the refusal of an op table (blame's input).
Stdlib only: the pandas-free GPU report (report_lean) reads it too."""
from __future__ import annotations

import os

from partui.analysis.figures.definitions import KINETO_CPU_TERMS, TERMS

ROWS = 40          # --by pair is a row per all-to-all: 150 on a small DualPipeV trace
TABLE_SUFFIXES = (".parquet", ".csv")   # op tables: blame's input, not a trace


def rows_shown(rows: str) -> int | None:
    """--rows as a count (None: all); ValueError naming the fix."""
    if rows == "all":
        return None
    try:
        n = int(rows)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"--rows {rows}: rows to print are 1 or more, or all; e.g. --rows {ROWS} "
                         f"or --rows all")
    return n


def head_of(table, limit: int | None, fmt: str):
    """(the rows of a frame to print, the line saying how many were left out: '' when none)."""
    if limit is None or fmt not in ("table", "markdown") or len(table) <= limit:
        return table, ""
    return table.head(limit), left_out_line(len(table), limit)


def left_out_line(rows: int, limit: int) -> str:
    return f"... {rows - limit} more rows not shown (the first {limit} of {rows}; --rows all prints every one)"


def refuse_op_tables(*paths) -> None:
    """ValueError pointing to blame for an op table given as a trace (a missing one is left to the
    reader's "no such file")."""
    for path in paths:
        if path and str(path).endswith(TABLE_SUFFIXES) and os.path.isfile(path):
            raise ValueError(f"{path} is an op table, not a trace: partui blame reads tables (partui "
                             f"blame {path}); report reads a trace (.json or .json.gz)")


def terms_of(df) -> tuple[str, ...]:
    """The terms a report defines: a torch.profiler trace on CPU without partui's own ranges is
    read by op names (aten, gloo, c10d), so partui's span terms would not describe it."""
    ours = any(str(t).startswith("partui") for t in df["track"].unique())  # --profile's tracks
    if df.attrs.get("format") == "kineto" and not (df["device"] == "gpu").any() and not ours:
        return KINETO_CPU_TERMS
    return TERMS
