"""`partui report TRACE`: overlap, exposed comm, idle and bubble tables; `--vs` two runs; `--plot`."""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import pandas as pd

from partui.analysis import TraceError, load, overlap, oversubscription_note, step_times

FORMATS = ("table", "csv", "json", "markdown")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("report", help="overlap / bubble report of a recorded trace")
    p.add_argument("trace", help="a partui trace (.json or .json.gz) or a torch.profiler trace")
    p.add_argument("--by", default="rank", choices=("rank", "step", "op"))
    p.add_argument("--format", default="table", choices=FORMATS)
    p.add_argument("--vs", metavar="OTHER", help="a second trace to set beside this one")
    p.add_argument("--plot", metavar="FILE.png", help="draw a per-rank timeline to this PNG")
    p.set_defaults(func=run)
    return p


def _render(df: pd.DataFrame, fmt: str) -> str:
    df = df.round(3)
    if fmt == "csv":
        return df.to_csv(index=False).rstrip("\n")
    if fmt == "json":
        return df.to_json(orient="records")
    if fmt == "markdown":  # written here: pandas' to_markdown needs the tabulate package
        cols = list(df.columns)
        rows = [" | ".join(_cell(v) for v in r) for r in df.itertuples(index=False)]
        return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                         + [f"| {r} |" for r in rows])
    return df.to_string(index=False, na_rep="-")


def _cell(v) -> str:
    return "-" if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA else str(v)


def compare(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Two runs side by side: mean step time, overlap (in flight during compute) and time saved."""
    rows = {}
    for label, df in (("this", a), ("other", b)):
        ov = overlap(df, "rank")
        st = step_times(df)
        rows[label] = {
            "trace": df.attrs.get("path", label),
            "step_ms": st["step_ms"].mean(),
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


def _verdict(t: pd.DataFrame) -> str:
    saved = t.loc[2, "step_ms"]
    pct = 100 * saved / t.loc[1, "step_ms"] if t.loc[1, "step_ms"] else float("nan")
    more = "saves" if saved > 0 else "costs"
    return (f"this run {more} {abs(saved):.3f} ms a step ({abs(pct):.1f}% of the other's) "
            f"with {t.loc[0, 'overlap_pct']:.1f}% comm in flight during compute vs "
            f"{t.loc[1, 'overlap_pct']:.1f}%: on shared cores overlap in flight is not time saved")


def run(args) -> int:
    folder = os.path.dirname(os.path.abspath(args.plot)) if args.plot else ""
    if args.plot and not os.path.isdir(folder):
        print(f"partui report: --plot {args.plot}: folder {folder} does not exist; create it or "
              f"pick another path", file=sys.stderr)
        return 2
    try:
        df = load(args.trace)
        other = load(args.vs) if args.vs else None
        if other is not None:
            table = compare(df, other)
        else:
            table = overlap(df, args.by)
        out = _render(table, args.format)
        if other is not None and args.format in ("table", "markdown"):
            out += "\n" + _verdict(table)
        note = oversubscription_note(df) if other is None and args.by == "rank" else None
        if note and args.format in ("table", "markdown"):
            out += "\n" + note
        if args.plot:
            plot_timeline(df, args.plot)
    except TraceError as exc:
        print(f"partui report: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"partui report: --plot needs matplotlib ({exc}); pip install matplotlib",
              file=sys.stderr)
        return 2
    print(out)
    if args.plot:
        print(f"timeline written to {args.plot}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- the timeline PNG

COLORS = {"F": "#9ecae1", "B": "#2171b5", "W": "#969696", "optimizer": "#fdae6b",
          "wait": "#fcbba1", "comm": "#e6550d"}


def plot_timeline(df: pd.DataFrame, path: str) -> str:
    """One row per rank: compute spans by kind, comm in flight as a thin bar under the row."""
    import matplotlib  # lazy and optional: a heavy extra, only for --plot
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    ranks = sorted(df["rank"].unique())
    t0 = df["ts"].min()
    fig, ax = plt.subplots(figsize=(14, 0.7 * len(ranks) + 1.5))
    # outermost compute spans only, so nested layer spans do not paint over their F/B
    comp = df[df["kind"] == "compute"].sort_values(["rank", "ts"])
    prev_end = comp.groupby("rank")["end"].transform(lambda e: e.cummax().shift())
    comp = comp[~(comp["ts"] < prev_end)]
    for i, r in enumerate(ranks):
        y = len(ranks) - 1 - i
        c = comp[comp["rank"] == r]
        cats = c["cat"].astype(str)
        colors = [COLORS.get(k, "#74c476") for k in cats]
        ax.broken_barh(list(zip((c["ts"] - t0) / 1e3, c["dur"] / 1e3)), (y, 0.6), facecolors=colors)
        for kind, height in (("wait", 0.6), ("comm", 0.15)):
            s = df[(df["rank"] == r) & (df["kind"] == kind)]
            base = y if kind == "wait" else y - 0.2
            ax.broken_barh(list(zip((s["ts"] - t0) / 1e3, s["dur"] / 1e3)), (base, height),
                           facecolors=COLORS[kind], alpha=0.5 if kind == "wait" else 1.0)
    ax.set_yticks([len(ranks) - 1 - i + 0.3 for i in range(len(ranks))])
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.set_xlabel("time (ms)")
    ax.set_title(f"{df.attrs.get('path', '')}: compute (F light, B dark, W grey), comm in flight "
                 f"(thin bar), idle blank")
    ax.legend(handles=[Patch(color=v, label=k) for k, v in COLORS.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.35 if len(ranks) < 3 else -0.12), frameon=False,
              ncol=len(COLORS), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
