"""`partui blame TRACE`: who made the steps slow and by how much. The cross-rank critical path of
the slowest step and the what-if attribution of the straggler slowdown (partui/analysis/replay/blame.py),
from an op-level trace (parquet or csv: the ByteDance straggler artifact's columns) or a partui
trace."""
from __future__ import annotations

import argparse
import json
import sys

from partui.analysis.replay.blame import FIGURES, analyse
from partui.analysis.replay.blame_marks import write_marked
from partui.analysis.replay.bytedance_graph import bytedance_graphs
from partui.analysis.figures.definitions import BLAME, definitions_of, help_text
from partui.analysis.table.events import TraceError
from partui.analysis.reading.op_table import read_op_table
from partui.analysis.replay.partui_graph import partui_graphs
from partui.analysis.reading.reader import read_doc
from partui.commands.paths import check_output_file
from partui.commands.report import FORMATS, render

SECTIONS = ("summary", "by dp rank", "by stage", "by op type", "by worker", "critical path")


def add_parser(subparsers) -> argparse.ArgumentParser:
    epilog = help_text(BLAME)
    p = subparsers.add_parser("blame", help="stragglers: the critical path across ranks and what "
                              "each rank, stage and op type cost the step",
                              epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="an op-level trace (.parquet or .csv with the columns dp_rank, "
                   "stage, rank, step, optype, start_ts, duration, seq_id) or a partui trace "
                   "(.json / .json.gz, partui run --trace)")
    p.add_argument("--format", default="table", choices=FORMATS)
    p.add_argument("--critical-path", metavar="OUT.json",
                   help="a partui trace: write a copy with the slowest step's critical path marked "
                        "(args.critical_path on its slices, one flow chain through them) for Perfetto")
    p.set_defaults(func=run)
    return p


def graphs_of(path: str) -> list:
    """The step graphs of an op-level table (.parquet / .csv) or of a partui trace."""
    if path.endswith((".parquet", ".csv")):
        return bytedance_graphs(read_op_table(path))
    return partui_graphs(read_doc(path))


def render_all(result: dict, fmt: str) -> str:
    if fmt == "json":
        doc = {name: json.loads(result[name].to_json(orient="records")) for name in SECTIONS}
        doc["critical path step"] = int(result["critical path"].attrs.get("step", 0))
        doc["definitions"] = definitions_of(FIGURES)
        return json.dumps(doc)
    out = []
    for name in SECTIONS:
        df = result[name]
        if name == "summary":
            df = df.assign(value=[_cell(v) for v in df["value"]])
        title = name if name != "critical path" else \
            f"critical path (step {result['critical path'].attrs.get('step')})"
        out.append(f"# {title}" if fmt == "csv" else f"{title}:" if fmt == "table" else f"### {title}")
        out.append(render(df, fmt))
        out.append("")
    if fmt in ("table", "markdown"):
        out += ["definitions:"] + [f"  {k}: {v}" for k, v in definitions_of(FIGURES).items()]
    return "\n".join(out).rstrip("\n")


def _cell(v):
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def run(args) -> int:
    try:
        if args.critical_path and args.trace.endswith((".parquet", ".csv")):
            raise TraceError(f"--critical-path marks a partui trace; {args.trace} is an op-level "
                             f"table with no slices to mark")
        if args.critical_path:
            check_output_file(args.critical_path, "--critical-path", (".json", ".json.gz"),
                              "traces/marked.json")
        result = analyse(graphs_of(args.trace))
    except (TraceError, ValueError) as exc:
        print(f"partui blame: {exc}", file=sys.stderr)
        return 2
    print(render_all(result, args.format))
    if args.critical_path:
        n = write_marked(read_doc(args.trace), result["critical path"].attrs["spans"],
                         args.critical_path)
        print(f"{n} slices on the critical path marked: {args.critical_path}", file=sys.stderr)
    return 0

