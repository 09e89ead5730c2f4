"""`partui report` read through the analysis table (pandas): every view, format and flag the pandas-free
GPU report (report_lean) does not serve: partui traces, CPU torch.profiler traces, --by step / op / pair /
schedule, --vs, --plot, --routing, --memory."""
from __future__ import annotations

import json
import sys

import pandas as pd

from partui.analysis import TraceError, hta_overlap, load, overlap, oversubscription_note
from partui.analysis.gpu.comm_kernels import family_lines, family_table
from partui.analysis.figures.cpu import core_sharing_line
from partui.analysis.figures.definitions import definitions, legend
from partui.analysis.gpu.gpu_steps import gpu_step_sums
from partui.analysis.figures.kineto_pairs import frame_pairs, is_part_trace, kineto_pair_summary, pair_frame
from partui.analysis.figures.memory import memory_table, plot_memory
from partui.analysis.figures.pair_plan import planner_beside
from partui.analysis.figures.pairs import fb_pair_a2a, pair_summary
from partui.analysis.figures.routing import routing_steps, routing_table
from partui.analysis.figures.schedule_view import schedule_view
from partui.analysis.figures.streams import gpu_overlap, stream_busy
from partui.commands.report_render import render
from partui.commands.report_rows import head_of, terms_of
from partui.commands.report_vs import compare, vs_verdict

ROUTING_DIGITS = {"balance_loss": 8, "bias_min": 6, "bias_max": 6}   # small by design (alpha 1e-4)


def gpu_sections(df: pd.DataFrame, fmt: str, sums: pd.DataFrame | None = None) -> list[tuple[str, object]]:
    """A torch.profiler GPU trace's extra tables: GPU kernels per rank (comm against compute on the GPU,
    what no compute kernel hid), streams, comm families; rendered text, or rows for json."""
    if not (df["device"] == "gpu").any():
        return []
    tables = [("gpu", gpu_overlap(df, sums)), ("streams", stream_busy(df, sums)), ("comm_kernels", family_table(df))]
    if fmt == "json":
        return [(name, json.loads(t.round(3).to_json(orient="records"))) for name, t in tables]
    return [(name, render(t, fmt)) for name, t in tables[:2] if len(t)]   # families: family_lines


def cpu_only_note(df: pd.DataFrame) -> str | None:
    """A torch.profiler trace without a GPU kernel: say so; its CPU ops are what gets analysed."""
    if df.attrs.get("format") != "kineto" or (df["device"] == "gpu").any():
        return None
    return (f"partui report: {df.attrs.get('path', 'the trace')}: no GPU kernels (a CPU-only torch.profiler "
            f"trace): analysing its CPU ops instead (aten::* compute, gloo:* / c10d::* comm)")


def run_frames(args, limit: int | None) -> int:
    """The report through the analysis table; args as report.run checked them, limit: --rows."""
    if args.memory:
        return memory_report(args)
    if args.routing:
        if args.vs or args.plot or args.by != "rank":
            print("partui report: --routing is a table of its own: drop --vs, --plot and --by",
                  file=sys.stderr)
            return 2
        try:
            print(render(routing_table(routing_steps(args.trace)), args.format, ROUTING_DIGITS))
        except TraceError as exc:
            print(f"partui report: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        quiet = False if args.format == "json" else None  # progress on a terminal (None), never in json
        df = load(args.trace, args.comm_kernels, progress=quiet)
        other = load(args.vs, args.comm_kernels, progress=quiet) if args.vs else None
        sums = pairs = None
        if other is not None:
            table = compare(df, other)
        elif args.by == "pair":   # a torch.profiler trace's part annotations, or partui's own pairs
            pairs = frame_pairs(df) if is_part_trace(df) else None
            table = pair_frame(pairs.table) if pairs is not None else fb_pair_a2a(df)
            if table.empty:
                print(f"partui report: {args.trace} holds no F&B pairs, so --by pair has nothing to "
                      f"show: record a run with --fb-overlap (e.g. partui run --pp 2 --ep 2 "
                      f"--experts 4 --fb-overlap --trace traces/fb.json) or pick --by rank",
                      file=sys.stderr)
                return 2
        elif args.by == "schedule":
            table = schedule_view(df, args.step)
        else:  # a GPU trace's per-step kernel sums: swept once, read by this table and the GPU ones
            sums = gpu_step_sums(df) if args.by in ("rank", "step") and (df["device"] == "gpu").any() else None
            table = overlap(df, args.by, sums)
            if args.by == "rank" and (df["device"] == "gpu").any():  # HTA's own figure beside
                table = table.merge(hta_overlap(df, args.include_last_step), on="rank", how="left")
        shown_rows, left_out = head_of(table, limit, args.format)
        out = render(shown_rows, args.format) + (f"\n{left_out}" if left_out else "")
        gpu_blocks = gpu_sections(df, args.format, sums) if other is None and args.by == "rank" else []
        if args.format == "json" and gpu_blocks:
            doc = {**json.loads(out), **dict(gpu_blocks)}
            doc["definitions"].update(definitions([c for _, rows in gpu_blocks for r in rows[:1] for c in r]))
            doc["notes"] = family_lines(df)     # the no-comm-kernel warning reaches json readers too
            out = json.dumps(doc)
        elif args.format in ("table", "markdown"):
            out += "".join(f"\n\n{name}:\n{block}" for name, block in gpu_blocks)
        cpu_only = cpu_only_note(df)
        if cpu_only:
            print(cpu_only, file=sys.stderr)
        if args.by == "pair" and other is None and args.format in ("table", "markdown"):
            out += "\n" + (kineto_pair_summary(table) if pairs is not None else pair_summary(table))
            if pairs is not None:   # the planner's order and the recorded one in one model, beside the GPU's
                out += "\n" + planner_text(args.trace, pairs)
        if other is not None and args.format in ("table", "markdown"):
            out += "\n" + vs_verdict(table)
        notes = [oversubscription_note(df), core_sharing_line(table)] if (
            other is None and args.by == "rank") else []
        shown = list(table.columns) + ([c for _, t in gpu_blocks for c in t.split("\n", 1)[0].split()]
                                       if args.format == "table" else [])
        notes = [n for n in notes if n] + family_lines(df) + legend(list(dict.fromkeys(shown)),
                                                                   terms_of(df))
        if args.format in ("table", "markdown"):
            out += "\n" + "\n".join(notes)
        elif args.format == "csv":  # stdout stays plain CSV
            print("\n".join(notes), file=sys.stderr)
        if args.plot:
            plot_timeline(df, args.plot)
    except (TraceError, ImportError) as exc:
        return refuse(exc)
    print(out)
    if args.plot:
        print(f"timeline written to {args.plot}", file=sys.stderr)
    return 0


def planner_text(path: str, pairs) -> str:
    """pair_plan's side-by-side, or the one line saying why the parts give no costs to plan with."""
    try:
        return planner_beside(path, pairs)[1]
    except ValueError as exc:
        return f"no planner comparison: {exc}"


def refuse(exc: Exception) -> int:
    """Exit 2 naming the trace's problem, or the matplotlib that --plot needs."""
    what = (f"--plot needs matplotlib ({exc}); pip install matplotlib"
            if isinstance(exc, ImportError) else exc)
    print(f"partui report: {what}", file=sys.stderr)
    return 2


def memory_report(args) -> int:
    """`--memory`: a table per rank from the trace's counters; `--plot` draws them stacked."""
    if args.vs or args.by != "rank":
        print("partui report: --memory is a table of its own: drop --vs and --by", file=sys.stderr)
        return 2
    try:
        table, samples = memory_table(args.trace)
        args.plot and plot_memory(samples, args.plot)
    except (TraceError, ImportError) as exc:
        return refuse(exc)
    out = render(table, args.format)
    if args.format in ("table", "markdown"):
        out += "\n" + "\n".join(legend(list(table.columns)))
    print(out)
    if args.plot:
        print(f"memory timeline written to {args.plot}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- the timeline PNG

COLORS = {"F": "#9ecae1", "B": "#2171b5", "W": "#969696", "layer": "#6baed6", "expert": "#31a354",
          "attention": "#756bb1", "loss": "#a1d99b", "optimizer": "#fdae6b", "wait": "#fcbba1",
          "comm": "#e6550d"}
OTHER_COMPUTE = "#74c476"


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
        colors = [COLORS.get(k, OTHER_COMPUTE) for k in cats]
        ax.broken_barh(list(zip((c["ts"] - t0) / 1e3, c["dur"] / 1e3)), (y, 0.6), facecolors=colors)
        for kind, height in (("wait", 0.6), ("comm", 0.15)):
            s = df[(df["rank"] == r) & (df["kind"] == kind)]
            base = y if kind == "wait" else y - 0.2
            ax.broken_barh(list(zip((s["ts"] - t0) / 1e3, s["dur"] / 1e3)), (base, height),
                           facecolors=COLORS[kind], alpha=0.5 if kind == "wait" else 1.0)
    ax.set_yticks([len(ranks) - 1 - i + 0.3 for i in range(len(ranks))])
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.set_xlabel("time (ms)")
    ax.set_title(f"{df.attrs.get('path', '')}: compute (leaf spans; containers such as F&B pairs "
                 f"are not drawn), waits (pale red), comm in flight (thin bar), idle blank")
    ax.legend(handles=[Patch(color=v, label=k) for k, v in COLORS.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.35 if len(ranks) < 3 else -0.12), frameon=False,
              ncol=len(COLORS), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
