"""`partui report TRACE`: overlap, exposed comm, idle and bubble tables; `--vs` two runs; `--plot`;
`--routing`: the MoE routing table of a trace or of `partui run --json` output.

A torch.profiler GPU trace by rank (no --vs, --plot, --routing, --memory) is read and printed without
pandas (report_lean); everything else through the analysis table (report_frames, imported only then).
"""
from __future__ import annotations

import argparse
import sys

from partui.analysis.gpu.comm_families import FAMILIES
from partui.analysis.figures.definitions import BY_PAIR, BY_SCHEDULE, GPU, MEMORY, REPORT, ROUTING, help_text
from partui.commands.paths import check_output_file
from partui.commands.report_lean import lean_report
from partui.commands.report_render import FORMATS, render
from partui.commands.report_rows import ROWS, refuse_op_tables, rows_shown

__all__ = ["FORMATS", "add_parser", "render", "run"]   # and `compare`, loaded on first use (__getattr__)
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("report", help="overlap / bubble report of a recorded trace",
                              epilog=help_text(REPORT, BY_PAIR, BY_SCHEDULE, GPU, MEMORY, ROUTING),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="a partui trace (.json or .json.gz), a torch.profiler trace, or a "
                   "directory of per-rank torch.profiler traces (HTA's input)")
    p.add_argument("--by", default="rank", choices=("rank", "step", "op", "pair", "schedule"),
                   help="pair: each all-to-all inside an F&B pair (--fb-overlap) and what it flew under; "
                        "schedule: a pipeline step's actions beside the simulator's, with lateness")
    p.add_argument("--step", type=int, default=None,
                   help="--by schedule: which traced step (default: the last)")
    p.add_argument("--format", default="table", choices=FORMATS)
    p.add_argument("--rows", default=str(ROWS), metavar="N|all",
                   help=f"rows of a long table to print (table and markdown; csv and json hold "
                        f"all), the summary still over every row (default {ROWS}; all: every one)")
    p.add_argument("--vs", metavar="OTHER", help="a second trace to set beside this one")
    p.add_argument("--plot", metavar="FILE.png", help="draw a per-rank timeline to this file (.png, "
                   ".svg or .pdf)")
    p.add_argument("--include-last-step", action="store_true",
                   help="torch.profiler GPU traces: HTA's include_last_profiler_step (HTA's default, "
                        "and ours, drops kernels launched in the last ProfilerStep)")
    p.add_argument("--comm-kernels", action="append", default=[], metavar="REGEX",
                   help="torch.profiler GPU traces: GPU kernels whose names match REGEX (searched, "
                        "case-insensitive) are comm too, beside the built-in families "
                        f"({', '.join(FAMILIES)}); repeatable")
    p.add_argument("--routing", action="store_true",
                   help="the MoE routing table per step and layer (TRACE may be `partui run "
                        "--json` output)")
    p.add_argument("--memory", action="store_true",
                   help="each rank's memory account: peak, the action at it, each kind then "
                        "(with --plot: the kinds stacked over time)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    try:
        limit = rows_shown(args.rows)
        refuse_op_tables(args.trace, args.vs)
    except ValueError as exc:
        print(f"partui report: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        try:       # matplotlib would add .png to a bare name and write beside it
            check_output_file(args.plot, "--plot", PLOT_SUFFIXES, "timeline.png")
        except ValueError as exc:
            print(f"partui report: {exc}", file=sys.stderr)
            return 2
    served = lean_report(args, limit)   # a GPU trace by rank: no pandas
    if served is not None:
        return served
    from partui.commands.report_frames import run_frames
    return run_frames(args, limit)


def __getattr__(name: str):
    """`compare` (report A --vs B) for Python callers, loaded on first use: it reads frames (pandas)."""
    if name != "compare":
        raise AttributeError(f"module 'partui.commands.report' has no attribute {name!r}")
    from partui.commands.report_vs import compare
    return compare
