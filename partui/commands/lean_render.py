"""Tables of plain columns (name -> numpy array) printed as `partui report` prints a frame (report.render:
pandas' to_json, to_csv and to_string, and the report's own markdown), spelt the same without pandas, so
the pandas-free GPU report (report_lean) prints what the frame path prints byte for byte. Each spelling
below is pandas' own rule, written out; tests/lab/test_report_lean.py holds them to pandas on every real
trace and on hand-built ones.
"""
from __future__ import annotations

import csv
import io
import math
import re

import numpy as np

from partui.commands.report_render import cell

DIGITS = 3            # report.render's rounding
PRECISION = 6         # pandas' display.precision: to_string's float digits before trimming
JSON_DIGITS = 10      # pandas' to_json double_precision


def rounded(table: dict) -> dict:
    """Float columns rounded to DIGITS places (DataFrame.round); others as they are."""
    return {c: np.round(v, DIGITS) if v.dtype.kind == "f" else v for c, v in table.items()}


def json_rows(table: dict) -> list[dict]:
    """The rows as to_json(orient="records") writes them, read back: floats through pandas' own
    fixed-point spelling (JSON_DIGITS decimals), NaN as None, numbers as Python numbers."""
    cols = {c: ([None if math.isnan(x) else json_float(x) for x in v.tolist()] if v.dtype.kind == "f" else v.tolist())
            for c, v in rounded(table).items()}
    return [dict(zip(cols, row)) for row in zip(*cols.values())]


def json_float(v: float) -> float:
    """v as pandas' JSON encoder writes it (ujson: whole part, then the fraction to JSON_DIGITS decimals
    rounded half to odd-or-zero, trailing zeros dropped; %.10g outside 1e-15 .. 1e16), read back."""
    x = -v if v < 0 else v
    if x > 1e16 - 1 or (x != 0 and x < 1e-15):
        return float(f"{v:.{JSON_DIGITS}g}")
    scale = 10 ** JSON_DIGITS
    whole = int(x)
    tmp = (x - whole) * float(scale)
    frac = int(tmp)
    diff = tmp - frac
    if diff > 0.5:
        frac += 1
        if frac >= scale:
            frac, whole = 0, whole + 1
    elif diff == 0.5 and (frac == 0 or frac & 1):
        frac += 1
    out = float(f"{whole}.{frac:0{JSON_DIGITS}d}")
    return -out if v < 0 else out


def csv_text(table: dict) -> str:
    """to_csv(index=False), its last newline dropped: floats in numpy's shortest spelling, NaN empty."""
    cols = []
    for v in rounded(table).values():
        if v.dtype.kind == "f":
            text = v.astype(str).astype(object)
            text[np.isnan(v)] = ""
            cols.append(text.tolist())
        else:
            cols.append([str(x) for x in v.tolist()])
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(list(table))
    writer.writerows(zip(*cols))
    return out.getvalue().rstrip("\n")


def markdown_text(table: dict) -> str:
    """report.render's markdown: a header, a rule, a row per row with '-' for a missing value."""
    cols = list(table)
    values = [[cell(x) for x in v.tolist()] for v in rounded(table).values()]
    rows = [" | ".join(r) for r in zip(*values)]
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + [f"| {r} |" for r in rows])


NUMBER_WITH_DECIMAL = re.compile(r"^\s*[+-]?[0-9]+\.[0-9]*$")
ESCAPES = str.maketrans({"\t": "\\t", "\r": "\\r", "\n": "\\n"})


def string_text(table: dict) -> str:
    """to_string(index=False, na_rep="-"): each column right-justified to its widest cell, a numeric
    column's header led by a space, columns joined by one space."""
    cols = []
    for name, v in rounded(table).items():
        cells = float_cells(v) if v.dtype.kind == "f" else [f"{x:d}" for x in v.tolist()] \
            if v.dtype.kind in "iu" else [str(x).translate(ESCAPES) for x in v.tolist()]
        header = f" {name}" if v.dtype.kind in "iuf" else str(name)
        width = max([len(header)] + [len(c) for c in cells])
        cols.append([header.rjust(width)] + [c.rjust(width) for c in cells])
    return "\n".join(" ".join(row) for row in zip(*cols))


def float_cells(v: np.ndarray) -> list[str]:
    """A float column as to_string spells it: PRECISION decimals, trailing zeros trimmed equally over the
    column (one kept); scientific where a value is under 10**-PRECISION, or over 1e6 in a column
    whose longest cell passes PRECISION + 6 characters; NaN '-'."""
    fixed = trim_zeros(["-" if math.isnan(x) else f"{x:.{PRECISION}f}" for x in v.tolist()])
    magnitude = np.abs(v[~np.isnan(v)])
    small = ((magnitude < 10 ** -PRECISION) & (magnitude > 0)).any()
    too_long = bool(fixed) and max(len(c) for c in fixed) > PRECISION + 6
    if small or (too_long and (magnitude > 1e6).any()):
        return trim_zeros(["-" if math.isnan(x) else f"{x:.{PRECISION}e}" for x in v.tolist()])
    return fixed


def trim_zeros(cells: list[str]) -> list[str]:
    """Trailing zeros trimmed from every decimal number while all of them end in one, one kept after the point."""
    number = [NUMBER_WITH_DECIMAL.match(c) is not None for c in cells]
    if not any(number):
        return cells
    while all(c.endswith("0") for c, n in zip(cells, number) if n):
        cells = [c[:-1] if n else c for c, n in zip(cells, number)]
    return [c + "0" if n and c.endswith(".") else c for c, n in zip(cells, number)]
