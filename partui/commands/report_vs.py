"""`partui report A --vs B`: two runs side by side (mean step, comm, overlap, idle, bubble; the
difference) and the one-line verdict under the table."""
from __future__ import annotations

import pandas as pd

from partui.analysis import overlap, step_times


def compare(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Two runs side by side: mean step time, overlap (in flight during compute) and time saved."""
    rows = {}
    for label, df in (("this", a), ("other", b)):
        ov = overlap(df, "rank")
        st = step_times(df)
        rows[label] = {
            "trace": df.attrs.get("path", label),
            "world_step_ms": st["world_step_ms"].mean(),
            "comm_ms": ov["comm_ms"].mean(),
            "overlapped_ms": ov["overlapped_ms"].mean(),
            "exposed_comm_ms": ov["exposed_comm_ms"].mean(),
            "idle_ms": ov["idle_ms"].mean(),
            "overlap_pct": ov["overlap_pct"].mean(),
            "bubble_pct": ov["bubble_pct"].mean(),
        }
    t = pd.DataFrame(rows).T
    metrics = [c for c in t.columns if c != "trace"]
    diff = {c: float(t.loc["other", c]) - float(t.loc["this", c]) for c in metrics}
    t.loc["other - this"] = {"trace": "difference", **diff}
    t[metrics] = t[metrics].astype(float)
    t.insert(0, "run", t.index)
    return t.reset_index(drop=True)


def vs_verdict(t: pd.DataFrame) -> str:
    """One line: what this run saves or costs a step against the other, and their overlap."""
    saved = t.loc[2, "world_step_ms"]
    pct = 100 * saved / t.loc[1, "world_step_ms"] if t.loc[1, "world_step_ms"] else float("nan")
    more = "saves" if saved > 0 else "costs"
    return (f"this run {more} {abs(saved):.3f} ms a step ({abs(pct):.1f}% of the other's) "
            f"with {t.loc[0, 'overlap_pct']:.1f}% comm in flight during compute vs "
            f"{t.loc[1, 'overlap_pct']:.1f}%: on shared cores overlap in flight is not time saved")
