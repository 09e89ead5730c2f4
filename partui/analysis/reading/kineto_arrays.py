"""A torch.profiler file's events (kineto_lean's columns) classified by kineto_kinds into the few rows the
pandas-free reports read, and the files joined into one GpuTrace: the GPU events (kernels, memcpys,
memsets), the CPU calls carrying a correlation id (launches), the ProfilerStep windows and the user
annotations (F&B pair parts). Every other CPU event (ops, Python functions) is dropped as its file is
classified, so a big trace holds what the figures read, not every event it holds.

Rows keep the analysis table's order: (rank, ts), ties in file order, a directory's files (one rank each)
in name order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from partui.analysis.gpu.comm_families import family_names
from partui.analysis.gpu.gpu_kernels import Kernels, hta_classes
from partui.analysis.gpu.kineto_kinds import (COMM, COMPUTE, STEP, STEP_COPY, STEP_PREFIX, event_kinds,
                                              gpu_categories, kernel_steps, launch_times, step_numbers)
from partui.analysis.gpu.pair_parts import Annotations

GPU_FIELDS = ("name", "kind", "step", "stream", "ts", "end", "dur", "corr")


class NotLean(Exception):
    """A trace (or request) the pandas-free reader leaves to the frame reader."""


@dataclass
class GpuTrace:
    """What a GPU report prints, as arrays: the counted kernels, what HTA's figure reads, the annotations."""
    kernels: Kernels
    ranks: list                # every rank of the trace, sorted (HTA's rows)
    hta: dict                  # hta_kept's and hta_overlap_pct's arrays
    world_size: int
    path: str
    annotations: Annotations   # the CPU user annotations (--by pair's parts and their holders)


class Tables:
    """What the files share as they are classified one by one: names, categories and streams numbered
    as first met, each name's comm family (matched once), the --comm-kernels patterns."""

    def __init__(self, comm_kernels):
        self.names: dict = {}
        self.cats: dict = {}
        self.streams: dict = {}
        self.families: list = []
        self.comm_kernels = comm_kernels


def recode(part: tuple, table: dict) -> np.ndarray:
    """A file's text column (codes, its distinct values) as int32 codes into table (grown as new values come)."""
    local, values = part
    place = np.array([table.setdefault(v, len(table)) for v in values], dtype=np.int32)
    return place[local] if len(values) else np.zeros(len(local), dtype=np.int32)


def kernel_tracks(pid: np.ndarray, tid: np.ndarray, rows: np.ndarray, threads: dict, streams: dict) -> np.ndarray:
    """The stream code of each kernel row (its thread's name, else its tid as text, as the table's track
    names), streams numbered in the order the rows meet them; each distinct (pid, tid) looked up once."""
    p, t = pid[rows], tid[rows]
    if p.dtype == object or t.dtype == object:   # text among the ids (Kineto's "Spans"): no order to sort by
        pairs: dict = {}
        at = np.array([pairs.setdefault(key, len(pairs)) for key in zip(p.tolist(), t.tolist())], dtype=np.int64)
        place = np.array([streams.setdefault(threads.get((a, b), str(b)), len(streams)) for a, b in pairs],
                         dtype=np.int32)
        return place[at] if len(at) else np.zeros(0, dtype=np.int32)
    p_ids, p_at = np.unique(p, return_inverse=True)
    t_ids, t_at = np.unique(t, return_inverse=True)
    pair, first, at = np.unique(p_at.ravel() * len(t_ids) + t_at.ravel(), return_index=True, return_inverse=True)
    place = np.empty(len(pair), dtype=np.int32)
    for j in np.argsort(first, kind="stable").tolist():   # first met first: the codes' order
        a, b = p_ids[pair[j] // len(t_ids)].item(), t_ids[pair[j] % len(t_ids)].item()
        place[j] = streams.setdefault(threads.get((a, b), str(b)), len(streams))
    return place[at.ravel()]


def file_rows(p: dict, t: Tables) -> dict:
    """One file's rows the reports read, in time order (stable): {"rank", "gpu": GPU events' GPU_FIELDS,
    "calls": CPU calls' ts and corr, "steps": ts, end, number, name code, "ann": user annotations' ts, end,
    dur, name code}. p: kineto_lean.rank_events' columns, consumed (its arrays dropped once read)."""
    rows = np.flatnonzero(p.pop("keep"))
    rows = rows[np.argsort(p["ts"][rows], kind="stable")]       # the file's complete events with a time
    ncode, ccode = recode(p.pop("name"), t.names), recode(p.pop("cat"), t.cats)
    name_list, cat_list = list(t.names), [str(c).lower() for c in t.cats]
    t.families += family_names(name_list[len(t.families):], t.comm_kernels)   # each new name matched once
    gpu = gpu_categories(cat_list)[ccode[rows]]
    if not gpu.any():
        raise NotLean("a CPU-only torch.profiler trace")
    is_comm = np.array([f is not None for f in t.families], dtype=bool)
    is_kernel, is_copy = (np.array([c == v for c in cat_list], dtype=bool) for v in ("kernel", STEP_COPY))
    numbers = step_numbers(name_list)
    g_rows, c_rows = rows[gpu], rows[~gpu]
    del rows, gpu
    kinds = {}
    for side, at in (("gpu", g_rows), ("cpu", c_rows)):   # kineto_kinds' reading, element by element
        n, c = ncode[at], ccode[at]
        kinds[side] = event_kinds(np.full(len(at), side == "gpu"), is_kernel[c], is_comm[n], numbers[n], is_copy[c])
    ts, end, dur, corr = p.pop("ts"), p.pop("end"), p.pop("dur"), p.pop("corr")
    c_corr = corr[c_rows]
    call = ~np.isnan(c_corr)
    c_kind, c_step = kinds["cpu"]
    is_step = c_kind == STEP
    is_ann = np.array([c == "user_annotation" for c in t.cats], dtype=bool)[ccode[c_rows]]   # the raw category
    # HTA's steps: every CPU event named ProfilerStep#..., the GPU track's copy too (its own rule)
    is_hta = np.array([str(n).startswith(STEP_PREFIX) for n in name_list], dtype=bool)[ncode[c_rows]]
    out = {"rank": p["rank"],
           "calls": {"ts": ts[c_rows[call]], "corr": c_corr[call]},
           "steps": {"ts": ts[c_rows[is_step]], "end": end[c_rows[is_step]], "number": c_step[is_step]},
           "hta_steps": {"ts": ts[c_rows[is_hta]], "end": end[c_rows[is_hta]], "name": ncode[c_rows[is_hta]]},
           "ann": {"ts": ts[c_rows[is_ann]], "end": end[c_rows[is_ann]], "dur": dur[c_rows[is_ann]],
                   "name": ncode[c_rows[is_ann]]}}
    g_kind, g_step = kinds["gpu"]
    g = {"name": ncode[g_rows], "kind": g_kind, "step": g_step, "ts": ts[g_rows], "end": end[g_rows],
         "dur": dur[g_rows], "corr": corr[g_rows]}
    del ts, end, dur, corr, ncode, ccode, c_rows
    g["stream"] = kernel_tracks(p.pop("pid"), p.pop("tid"), g_rows, p["threads"], t.streams)
    out["gpu"] = g
    return out


def step_kernels(f: dict) -> None:
    """Each of a file's GPU events in the step that launched it (kineto_kinds.kernel_steps), in place;
    a file without steps keeps NaN."""
    g, s, c = f["gpu"], f["steps"], f["calls"]
    if not len(s["ts"]):
        return
    one = lambda n: np.full(n, f["rank"], dtype=np.int64)  # noqa: E731  a file is one rank
    launch = launch_times(one(len(c["ts"])), c["corr"], c["ts"], one(len(g["ts"])), g["corr"])
    g["step"] = kernel_steps(one(len(g["ts"])), g["ts"], launch, one(len(s["ts"])), s["ts"], s["end"], s["number"])


def joined(files: list, table: str, fields) -> dict:
    """One table of every file's (files in rank order), with each row's rank."""
    out = {k: np.concatenate([f[table][k] for f in files]) for k in fields}
    out["rank"] = np.concatenate([np.full(len(f[table][fields[0]]), f["rank"], dtype=np.int64) for f in files])
    return out


def gpu_trace(files: list, t: Tables, world: int, path: str) -> GpuTrace:
    """The files' rows (file_rows') as one GpuTrace: files in rank order (stable: name order among equals,
    which the reader refuses), so each table is in (rank, ts) order."""
    files = sorted(files, key=lambda f: f["rank"])
    for f in files:
        step_kernels(f)
    any_steps = any(len(f["steps"]["ts"]) for f in files)
    g = joined(files, "gpu", GPU_FIELDS)
    calls = joined(files, "calls", ("ts", "corr"))
    steps = joined(files, "hta_steps", ("ts", "end", "name"))
    ann = joined(files, "ann", ("ts", "end", "dur", "name"))
    ranks = sorted({f["rank"] for f in files})
    files.clear()
    names = list(t.names)
    annotations = Annotations(rank=ann["rank"], ts=ann["ts"], end=ann["end"], dur=ann["dur"],
                              name=[names[i] for i in ann["name"].tolist()])
    hta = {"gpu_rank": g["rank"], "gpu_cls": hta_classes(names)[g["name"]], "gpu_ts": g["ts"], "gpu_end": g["end"],
           "gpu_corr": g["corr"], "cpu_rank": calls["rank"], "cpu_ts": calls["ts"], "cpu_corr": calls["corr"],
           "step_rank": steps["rank"], "step_name": [names[i] for i in steps["name"].tolist()],
           "step_ts": steps["ts"], "step_end": steps["end"]}
    return GpuTrace(kernels=counted(g, names, t, any_steps), ranks=ranks, hta=hta, world_size=world, path=path,
                    annotations=annotations)


def counted(g: dict, names: list, t: Tables, any_steps: bool) -> Kernels:
    """The kernels every view counts (gpu_steps.counted_kernels' rule: compute or comm, of positive
    length, and in a step where the trace has steps) as gpu_kernels' Kernels."""
    keep = np.isin(g["kind"], (COMM, COMPUTE)) & (g["end"] > g["ts"])
    if any_steps:
        keep &= ~np.isnan(g["step"])
    return Kernels(rank=g["rank"][keep], step=g["step"][keep], comm=g["kind"][keep] == COMM,
                   stream=g["stream"][keep], streams=list(t.streams), name=g["name"][keep], names=names,
                   families=t.families, ts=g["ts"][keep], end=g["end"][keep], dur=g["dur"][keep],
                   corr=g["corr"][keep])
