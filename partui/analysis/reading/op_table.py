"""An op-level trace (one row per op: the ByteDance straggler artifact's columns), read and checked
before blame builds a graph of it. A table blame cannot trust is refused, naming the rows or the rank:
no ops, a NaN or negative time, an op without a step, a rank missing steps, a rank missing from the
world. The job's `meta-NAME.yaml` beside `trace-NAME.parquet` (its world and dimension sizes), when
there, says how many ranks, dp ranks and stages to expect."""
from __future__ import annotations

import math
import os

import pandas as pd

from partui.analysis.table.events import TraceError

OP_COLUMNS = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id")
SHOWN_ROWS = 5        # rows or ranks named in a refusal
# the meta yaml's sizes the table must show (its world also counts tp and sequence ranks, which the
# op-level trace records once per worker, so the world is checked as their product)
META_SIZES = {"dp_size": ("dp_rank", "dp ranks"), "pp_size": ("stage", "stages")}


def read_op_table(path: str) -> pd.DataFrame:
    """An op-level trace (one row per op, OP_COLUMNS at least), from parquet or csv, checked."""
    if os.path.isdir(path):
        raise TraceError(f"{path}: is a directory; blame reads one op-level table (.parquet or .csv) "
                         f"or one partui trace (.json / .json.gz)")
    if not os.path.isfile(path):
        raise TraceError(f"{path}: no such file")
    if path.endswith(".parquet"):
        try:
            import pyarrow  # noqa: F401  (pandas reads parquet through it)
        except ImportError:
            raise TraceError(f"{path}: reading parquet needs pyarrow: pip install -e \".[parquet]\" in "
                             f"the checkout, or give the same columns as csv") from None
        df = pd.read_parquet(path)
    else:
        try:
            df = pd.read_csv(path)
        except pd.errors.EmptyDataError:
            raise TraceError(f"{path}: the file is empty; an op-level trace has a header row "
                             f"({', '.join(OP_COLUMNS)}) and one row per op") from None
        except (pd.errors.ParserError, UnicodeDecodeError) as e:
            raise TraceError(f"{path}: not a csv table ({e}); give one row per op with the columns "
                             f"{', '.join(OP_COLUMNS)}") from None
    check_op_table(df, path)
    check_against_meta(df, path, read_meta(meta_path(path)))
    return df


def rows_text(index) -> str:
    """`rows 3, 7, 9` (the first SHOWN_ROWS, 0-based table rows) and how many more."""
    index = list(index)
    more = f" and {len(index) - SHOWN_ROWS} more" if len(index) > SHOWN_ROWS else ""
    return f"row{'s' if len(index) > 1 else ''} {', '.join(map(str, index[:SHOWN_ROWS]))}{more}"


def check_op_table(df: pd.DataFrame, path: str) -> None:
    """Every column there, some ops, finite non-negative times, every op with a step, every rank with
    the same steps, and every worker (dp rank x stage) of the grid there, each one rank."""
    missing = [c for c in OP_COLUMNS if c not in df.columns]
    if "step" in missing:
        raise TraceError(f"{path}: no step ids (column 'step'): blame compares steps across ranks; "
                         f"record one step id per op")
    if missing:
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; an op-level trace needs "
                         f"{', '.join(OP_COLUMNS)}")
    if not len(df):
        raise TraceError(f"{path}: the table holds no ops; record at least one step of every rank")
    for column in ("start_ts", "duration"):
        values = pd.to_numeric(df[column], errors="coerce")
        bad = values.isna() | ~values.abs().lt(float("inf"))
        if bad.any():
            raise TraceError(f"{path}: {column} is not a finite number at {rows_text(df.index[bad])}: "
                             f"record every op's {column}, or drop those rows")
    negative = pd.to_numeric(df["duration"]) < 0
    if negative.any():
        raise TraceError(f"{path}: negative duration at {rows_text(df.index[negative])}: an op lasts "
                         f">= 0; fix or drop those rows")
    if df["step"].isna().any():
        raise TraceError(f"{path}: {int(df['step'].isna().sum())} ops without a step id (column "
                         f"'step'): give every op its step")
    pairs = df[["rank", "step"]].drop_duplicates()
    counts = pairs.groupby("rank").size()                  # distinct steps per rank, ranks sorted
    every = frozenset(pairs["step"].unique())
    short = counts.index[counts.to_numpy() < len(every)]
    if len(short):                                          # the first rank missing a step
        rank = short[0]
        lack = sorted(every - frozenset(pairs.loc[pairs["rank"] == rank, "step"]))
        if lack:
            more = " ..." if len(lack) > SHOWN_ROWS else ""
            raise TraceError(f"{path}: rank {rank} lacks step(s) {lack[:SHOWN_ROWS]}{more} the other "
                             f"ranks recorded: give every rank the same steps")
    workers = df[["dp_rank", "stage"]].drop_duplicates()
    dps, stages = sorted(workers["dp_rank"].unique()), sorted(workers["stage"].unique())
    have = set(map(tuple, workers.to_numpy().tolist()))
    absent = [(d, s) for d in range(int(max(dps)) + 1) for s in range(int(max(stages)) + 1)
              if (d, s) not in have]
    if absent:
        shown = ", ".join(f"dp {d} stage {s}" for d, s in absent[:SHOWN_ROWS])
        raise TraceError(f"{path}: no ops of {shown}{' ...' if len(absent) > SHOWN_ROWS else ''} (dp ranks "
                         f"0..{int(max(dps))} x stages 0..{int(max(stages))}): blame needs every worker of the "
                         f"job (a missing one changes every figure); add its ops")
    per_worker = df.groupby(["dp_rank", "stage"])["rank"].nunique()
    if (per_worker > 1).any():
        (d, s), n = next((k, v) for k, v in per_worker.items() if v > 1)
        raise TraceError(f"{path}: dp {d} stage {s} has ops of {n} ranks; an op-level trace records one "
                         f"rank per worker (dp rank, stage)")


def meta_path(path: str) -> str:
    """`meta-NAME.yaml` beside `trace-NAME.parquet` (the artifact's layout), else ''."""
    folder, name = os.path.split(path)
    stem = name.rsplit(".", 1)[0]
    if not stem.startswith("trace-"):
        return ""
    meta = os.path.join(folder, "meta-" + stem[len("trace-"):] + ".yaml")
    return meta if os.path.isfile(meta) else ""


def read_meta(path: str) -> dict[str, int]:
    """The job's sizes from its flat `key: value` yaml (the integer ones); {} without a file."""
    if not path:
        return {}
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            key, sep, value = line.partition(":")
            value = value.split("#", 1)[0].strip()
            if sep and value.lstrip("-").isdigit():
                out[key.strip()] = int(value)
    out["_path"] = path
    return out


def check_against_meta(df: pd.DataFrame, path: str, meta: dict) -> None:
    """The table's dp ranks and stages against the job's meta yaml, when there is one, and the meta's
    world against its own dimensions."""
    sizes = [meta.get(k) for k in ("dp_size", "pp_size", "tp_size", "dsp_size")]
    if "world_size" in meta and None not in sizes and math.prod(sizes) != meta["world_size"]:
        raise TraceError(f"{meta['_path']}: world_size {meta['world_size']} is not dp_size x pp_size x "
                         f"tp_size x dsp_size = {math.prod(sizes)}: fix the meta file")
    for key, (column, what) in META_SIZES.items():
        if key in meta:
            have = sorted(df[column].unique())
            want = list(range(meta[key]))
            if have != want:
                lost = sorted(set(want) - set(have))
                extra = sorted(set(have) - set(want))
                detail = (f"missing {lost[:SHOWN_ROWS]}" if lost else "") + \
                         (f"{'; ' if lost else ''}beyond it {extra[:SHOWN_ROWS]}" if extra else "")
                raise TraceError(f"{path}: {meta['_path']} says {key} {meta[key]} but the table has "
                                 f"{len(have)} {what} ({detail}): record every {column} of the job, "
                                 f"or fix the meta file")
