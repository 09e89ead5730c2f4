"""How `partui report` (and blame, whatif) print a frame: table, csv, json with its definitions, or
markdown. Imports no pandas itself (it is handed frames), so `partui report` loads it before knowing
whether its trace needs pandas at all."""
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from partui.analysis.figures.definitions import definitions

if TYPE_CHECKING:   # what linters see; a frame arrives already built
    import pandas as pd

FORMATS = ("table", "csv", "json", "markdown")


def render(df: pd.DataFrame, fmt: str, digits: dict | None = None) -> str:
    """A frame in one of FORMATS, rounded to 3 places (digits: other places by column)."""
    df = df.round({c: (digits or {}).get(c, 3) for c in df.columns})
    if fmt == "csv":
        return df.to_csv(index=False).rstrip("\n")
    if fmt == "json":  # the rows and what their columns count
        rows = json.loads(df.to_json(orient="records"))
        return json.dumps({"rows": rows, "definitions": definitions(df.columns)})
    if fmt == "markdown":  # written here: pandas' to_markdown needs the tabulate package
        cols = list(df.columns)
        rows = [" | ".join(cell(v) for v in r) for r in df.itertuples(index=False)]
        return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                         + [f"| {r} |" for r in rows])
    return df.to_string(index=False, na_rep="-")


def cell(v) -> str:
    """A markdown cell: '-' for a missing value (None, NaN, pandas' NA), else its text."""
    missing = v is None or (isinstance(v, float) and math.isnan(v)) or type(v).__name__ == "NAType"  # pandas.NA, named: no import
    return "-" if missing else str(v)
