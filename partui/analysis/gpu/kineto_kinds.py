"""The one reading of a torch.profiler (Kineto) trace's events, as array functions over codes and
distinct names: which events are GPU events, which kernels are comm (comm_families), which are compute,
the ProfilerStep a name numbers, each kernel's launch and the step that launched it. kineto.py (the
analysis table) and kineto_lean.py (`partui report` without pandas) both call these, so the two
readers cannot drift apart. Words: partui.analysis.figures.definitions ("torch.profiler GPU traces").

A kernel's launch is the CPU-side call that carries its correlation id (the link Kineto's `ac2g` flows
draw), whatever the API: runtime and driver launches (cudaLaunchKernel, cudaLaunchKernelExC,
cuLaunchKernel), graph launches (cudaGraphLaunch), ROCm's hipLaunchKernel / hipModuleLaunchKernel, and
the memcpy calls that start a peer copy. A kernel belongs to the step whose ProfilerStep#N window holds
its launch's start, never to the CPU window it happens to run in. A kernel no CPU call claims belongs to
the last step of its rank that began before it started (it cannot run before its launch); a kernel
launched outside every step belongs to none.
"""
from __future__ import annotations

import re

import numpy as np

KINDS = ["comm", "wait", "compute", "step", "other"]   # the analysis table's `kind`, by code
COMM, WAIT, COMPUTE, STEP, OTHER = range(len(KINDS))
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")       # Kineto's GPU events (lowercased category)
STEP_PREFIX = "ProfilerStep#"   # torch.profiler's step annotations: ProfilerStep#N
STEP_NAME = re.compile(rf"^{STEP_PREFIX}(\d+)$")
STEP_COPY = "gpu_user_annotation"   # Kineto's copy of a step on the GPU track: drawn, never a window
LOOKUP_ROWS = 1 << 20  # kernels looked up at a time: a few arrays this long, whatever the trace's size


def gpu_categories(cats) -> np.ndarray:
    """Per distinct category: whether its events are GPU events (kernels, memcpys, memsets)."""
    return np.array([str(c).lower() in GPU_CATS for c in cats], dtype=bool)


def step_numbers(names) -> np.ndarray:
    """Per distinct name: N of ProfilerStep#N, else NaN."""
    found = [STEP_NAME.match(str(n)) if n is not None else None for n in names]
    return np.array([float(m.group(1)) if m else np.nan for m in found], dtype=float)


def event_kinds(gpu: np.ndarray, cat_kernel: np.ndarray, comm_name: np.ndarray, step: np.ndarray,
                step_copy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kind code per event (KINDS), step per event) of a GPU trace's events: a GPU event whose name is of a
    comm family is comm, any other kernel (category kernel) compute; memcpy / memset outside a family are
    neither; a ProfilerStep#N outside the GPU's copy of it is a step. Arguments are per event."""
    comm = gpu & comm_name
    compute = cat_kernel & ~comm
    step = np.where(step_copy, np.nan, step)
    kind = np.select([comm, compute, ~np.isnan(step)], [COMM, COMPUTE, STEP], OTHER).astype(np.int8)
    return kind, step


def first_calls(corr: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct correlation ids in order, and each one's earliest call time."""
    if not len(corr):   # a rank without a CPU call carrying an id: nothing to look up
        return corr, ts
    if (corr[1:] > corr[:-1]).all():  # ids already in order, each once (one thread's launches, as
        return corr, ts                # torch.profiler writes them): no sort (0.1 s on a million)
    order = np.lexsort((ts, corr))  # by id, the earliest call of an id first
    corr, ts = corr[order], ts[order]
    del order
    first = np.flatnonzero(np.append(True, corr[1:] != corr[:-1]))
    return corr[first], ts[first]


def launch_times(call_rank: np.ndarray, call_corr: np.ndarray, call_ts: np.ndarray, k_rank: np.ndarray,
                 k_corr: np.ndarray, lookup_rows: int = LOOKUP_ROWS) -> np.ndarray:
    """Each kernel's launch start (us): the first CPU call of its rank (call_*: the CPU events carrying a
    correlation id) with its correlation id; NaN where none does. Binary search per rank over the calls'
    sorted ids (no per-kernel hashing), lookup_rows kernels at a time (bounded temporaries)."""
    out = np.full(len(k_rank), np.nan)
    k_corr = np.asarray(k_corr, dtype=float)
    one_rank = bool(len(k_rank) and len(call_rank)
                    and k_rank.min() == k_rank.max() == call_rank.min() == call_rank.max())
    for r in np.unique(k_rank):
        if one_rank:  # a torch.profiler file: its calls as they are, no masked copies
            ids, launched = first_calls(call_corr, call_ts)
        else:
            mine = call_rank == r
            ids, launched = first_calls(call_corr[mine], call_ts[mine])
        if not len(ids):
            continue
        at = None if one_rank else np.flatnonzero(k_rank == r)
        for lo in range(0, len(k_rank) if one_rank else len(at), lookup_rows):
            rows = slice(lo, lo + lookup_rows) if one_rank else at[lo:lo + lookup_rows]
            wanted = k_corr[rows]
            k = np.searchsorted(ids, wanted)
            np.minimum(k, len(ids) - 1, out=k)
            hit = ids[k] == wanted
            if one_rank:
                out[rows][hit] = launched[k[hit]]  # a slice of out: a view, written in place
            else:
                out[rows[hit]] = launched[k[hit]]
    return out


def kernel_steps(k_rank: np.ndarray, k_ts: np.ndarray, launch: np.ndarray, step_rank: np.ndarray,
                 step_ts: np.ndarray, step_end: np.ndarray, step_no: np.ndarray) -> np.ndarray:
    """Each kernel's step (NaN: none) from its launch time (launch_times; NaN: unclaimed, placed by its
    own start k_ts) and its rank's ProfilerStep windows (step_*: the CPU step events)."""
    out = np.full(len(k_rank), np.nan)
    claimed = ~np.isnan(launch)
    t = np.where(claimed, launch, k_ts)
    one_rank = len(k_rank) and k_rank.min() == k_rank.max()
    for r in np.unique(step_rank):
        w = np.flatnonzero(step_rank == r)
        w = w[np.argsort(step_ts[w], kind="stable")]
        w0, w1, number = step_ts[w], step_end[w], step_no[w]
        mine = slice(None) if one_rank and r == k_rank[0] else np.flatnonzero(k_rank == r)
        k = np.searchsorted(w0, t[mine], side="right")
        k -= 1
        ok = k >= 0
        np.maximum(k, 0, out=k)
        ok &= ~claimed[mine] | (t[mine] <= w1[k])   # an orphan: the last step begun before it ran
        got = number[k].astype(float)
        got[~ok] = np.nan
        out[mine] = got
    return out
