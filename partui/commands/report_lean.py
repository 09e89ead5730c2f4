"""`partui report TRACE` on a torch.profiler GPU trace without pandas: the trace read into arrays
(analysis/kineto_lean), every figure from gpu_kernels (the same functions the frame views call), printed
in the frame path's own spelling (lean_render). About 0.3 s where loading pandas alone took 0.55.

It serves `--by rank`, and `--by pair` on a trace with part annotations (pair_parts, pair_plan), with no
--vs, --plot, --routing or --memory, on a file or a directory of torch.profiler GPU traces; anything else
returns None before pandas is imported, and the frame path (report_frames) runs as it always has.
"""
from __future__ import annotations

import json
import sys

import numpy as np

from partui.analysis.gpu.comm_families import family_lines
from partui.analysis.figures.definitions import TERMS, definitions, legend
from partui.analysis.gpu.gpu_kernels import (family_rows, gpu_rows, hta_kept, hta_overlap_pct, rank_rows,
                                             rank_sums, step_sums, stream_rows)
from partui.analysis.reading.kineto_lean import NotLean, has_parts, lean_pairs, read_gpu_trace
from partui.analysis.gpu.pair_parts import COLUMNS as PAIR_COLUMNS
from partui.analysis.gpu.pair_parts import pair_summary
from partui.analysis.figures.pair_plan import planner_beside
from partui.commands.lean_render import csv_text, json_rows, markdown_text, string_text
from partui.commands.report_rows import left_out_line

TEXT = {"table": string_text, "markdown": markdown_text}


def lean_report(args, limit: int | None) -> int | None:
    """Print the report and return 0, or None where this path does not serve the request (the frame
    path then runs). limit: --rows, as report_rows.rows_shown read it."""
    if args.by not in ("rank", "pair") or args.vs or args.plot or args.routing or args.memory:
        return None
    try:
        # progress on a terminal for a long read (None), never in json (as the frame path's load)
        trace = read_gpu_trace(args.trace, args.comm_kernels, False if args.format == "json" else None)
    except NotLean:
        return None
    if args.by == "pair":
        return pair_report(args, trace, limit)
    tables = gpu_tables(trace, args.include_last_step)
    if tables is None:
        return None
    main, blocks = tables
    lines = family_lines(zip(*(blocks["comm_kernels"][c].tolist() for c in blocks["comm_kernels"])),
                         trace.world_size, trace.path)
    if args.format == "json":
        doc = {"rows": json_rows(main), "definitions": definitions(list(main)),
               **{name: json_rows(t) for name, t in blocks.items()}}
        doc["definitions"].update(definitions([c for t in blocks.values() if len(t["rank"]) for c in t]))
        doc["notes"] = lines
        print(json.dumps(doc))
        return 0
    if args.format == "csv":       # stdout stays plain CSV; the notes go to stderr
        print("\n".join(lines + legend(list(main), TERMS)), file=sys.stderr)
        print(csv_text(main))
        return 0
    text = TEXT[args.format]
    shown, left_out = head_rows(main, limit)
    out = text(shown) + (f"\n{left_out}" if left_out else "")
    rendered = [(name, text(t)) for name, t in list(blocks.items())[:2] if len(t["rank"])]
    out += "".join(f"\n\n{name}:\n{block}" for name, block in rendered)
    columns = list(main) + ([c for _, block in rendered for c in block.split("\n", 1)[0].split()]
                            if args.format == "table" else [])
    print(out + "\n" + "\n".join(lines + legend(list(dict.fromkeys(columns)), TERMS)))
    return 0


def pair_report(args, trace, limit: int | None) -> int | None:
    """--by pair: the parts' table, its summary line and the planner's order beside the recorded one, as
    report_frames prints them; None where the trace has no part annotations, or they launched no kernel
    (the frame path names what is missing)."""
    if not has_parts(trace):
        return None
    read = lean_pairs(trace)
    if not len(read.table["rank"]):
        return None
    table = pair_table(read.table)
    if args.format == "json":
        print(json.dumps({"rows": json_rows(table), "definitions": definitions(PAIR_COLUMNS)}))
        return 0
    k = trace.kernels
    rows = family_rows(k)
    notes = family_lines(zip(*(rows[c].tolist() for c in rows)), trace.world_size, trace.path) + legend(
        PAIR_COLUMNS, TERMS)
    if args.format == "csv":       # stdout stays plain CSV; the notes go to stderr
        print("\n".join(notes), file=sys.stderr)
        print(csv_text(table))
        return 0
    shown, left_out = head_rows(table, limit)
    try:
        planner = planner_beside(args.trace, read)[1]
    except ValueError as exc:
        planner = f"no planner comparison: {exc}"
    print(TEXT[args.format](shown) + (f"\n{left_out}" if left_out else "") + "\n" + pair_summary(read.table)
          + "\n" + planner + "\n" + "\n".join(notes))
    return 0


def pair_table(columns: dict) -> dict:
    """pair_parts' lists as typed columns (what the frame of them holds): ints, floats, text as objects."""
    text = ("pair", "part", "annotation", "under")
    return {c: np.array(v, dtype=object) if c in text else np.array(v, dtype=np.int64 if c in (
        "rank", "layer_k", "launched") else float) for c, v in columns.items()}


def gpu_tables(trace, include_last_step: bool) -> tuple[dict, dict] | None:
    """(the main table by rank with HTA's figure beside, {gpu, streams, comm_kernels}); None where no kernel
    counts (the frame path prints its empty tables)."""
    k = trace.kernels
    if not len(k.rank):
        return None
    per = rank_sums(step_sums(k))
    h = trace.hta
    kept = hta_kept(h["gpu_rank"], h["gpu_corr"], h["cpu_rank"], h["cpu_ts"], h["cpu_corr"], h["step_rank"],
                    h["step_name"], h["step_ts"], h["step_end"], include_last_step)
    pct = hta_overlap_pct(trace.ranks, h["gpu_rank"][kept], h["gpu_cls"][kept], h["gpu_ts"][kept],
                          h["gpu_end"][kept])
    hta = dict(zip(trace.ranks, pct.tolist()))
    main = rank_rows(per)
    main["comm_comp_overlap_pct"] = np.array([hta.get(r, np.nan) for r in main["rank"].tolist()], dtype=float)
    return main, {"gpu": gpu_rows(per), "streams": stream_rows(k, per), "comm_kernels": family_rows(k)}


def head_rows(table: dict, limit: int | None) -> tuple[dict, str]:
    """report_rows.head_of for columns: the first `limit` rows and the line naming the rest."""
    n = len(table["rank"])
    if limit is None or n <= limit:
        return table, ""
    return {c: v[:limit] for c, v in table.items()}, left_out_line(n, limit)
