"""The figures of a torch.profiler GPU trace, computed once on plain arrays (numpy, no pandas): each
step's GPU window and its kernels swept, a rank's sums, the main table's by-rank figures, the GPU and
streams tables, the comm families' counts and HTA's overlap. The frame views (gpu_steps, streams,
comm_kernels, metrics) build their frames from these dicts of arrays, and `partui report` on a GPU trace
prints them without pandas (report_lean), so each figure is computed in one place whichever path runs.
Words: partui.analysis.figures.definitions (view GPU; comm_comp_overlap_pct).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from partui.analysis.table.boundary_sweep import sweep
from partui.analysis.gpu.kineto_kinds import LOOKUP_ROWS  # kernels looked up at a time: bounded temporaries

US_MS = 1e-3
HTA_COMM = re.compile(r"^nccl.*Kernel")  # HTA's communication kernels (hta/utils/utils.py)
HTA_MEMORY = re.compile(r"Memcpy|Memset")  # HTA's memory kernels: neither comm nor compute


@dataclass
class Kernels:
    """The GPU kernels every view counts (kineto_kinds: compute or comm, of positive length and, where
    the trace has steps, in one), one entry per kernel in the analysis table's (rank, ts) order. A view
    of a big table takes only the fields it reads (gpu_steps.kernels_of); the others stay None."""
    rank: np.ndarray = None       # int64
    step: np.ndarray = None       # float: the step that launched it (NaN: a trace without steps)
    comm: np.ndarray = None       # bool: of a comm family
    stream: np.ndarray = None     # int (any width): code into streams
    streams: list = None          # each stream's name (Kineto's track name)
    name: np.ndarray = None       # int (any width): code into names (-1: none)
    names: list = None            # each distinct kernel name
    families: list = None         # per name: its comm family, None where not comm
    ts: np.ndarray = None
    end: np.ndarray = None
    dur: np.ndarray = None        # as recorded (the families' summed time)
    corr: np.ndarray = None       # float: the correlation id tying it to its launch (NaN: none)


def step_sums(k: Kernels) -> dict:
    """Per (rank, step), in (rank, step) order and us: the step's GPU window (its kernels' first start to
    last end), its compute kernels merged, its comm kernels merged, their intersection and union; wait
    NaN (a GPU trace records no waits). See packed_step_sums."""
    key, span = step_key(k.rank, k.step)
    return packed_step_sums(key, span, k.ts, k.end, k.comm.view(np.int8))  # a class byte, no copy


def step_key(rank: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, int]:
    """One int64 a kernel packing (rank, step + 1) (step -1: a trace without steps, each rank one window),
    and the span it packs by; built in one array (8 bytes a kernel), not factorized."""
    key = np.nan_to_num(step, nan=-1.0)
    key += 1
    span = int(key.max()) + 1 if len(key) else 1
    key = key.astype(np.int64)
    key += np.asarray(rank, dtype=np.int64) * span
    return key, span


def packed_step_sums(key: np.ndarray, span: int, ts: np.ndarray, end: np.ndarray, comm: np.ndarray) -> dict:
    """step_sums from each kernel's step_key, times and class byte (1: comm): the one computation both
    the frame views (gpu_steps) and the pandas-free report read; the sweep runs a chunk of keys at a time."""
    keys, lengths, inter0, union = sweep(key, ts, end, comm, 2)
    w0, w1 = np.full(len(keys), np.inf), np.full(len(keys), -np.inf)
    for lo in range(0, len(key), LOOKUP_ROWS):   # each step's first start and last end, bounded temporaries
        at = np.searchsorted(keys, key[lo:lo + LOOKUP_ROWS])
        np.minimum.at(w0, at, ts[lo:lo + LOOKUP_ROWS])
        np.maximum.at(w1, at, end[lo:lo + LOOKUP_ROWS])
    number = (keys % span - 1).astype(float)
    return {"rank": keys // span, "step": np.where(number < 0, np.nan, number),
            "window": w1 - w0, "compute": lengths[:, 0], "comm": lengths[:, 1],
            "wait": np.full(len(keys), np.nan), "overlapped": inter0[:, 1], "union": union}


def dense_codes(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct keys in order, each key's place among them), as np.unique(key, return_inverse=True)
    gives; keys packed from ranks, steps and streams span a small range, numbered by a table that long
    (no sort of a million keys)."""
    if not len(key) or key.min() < 0 or key.max() >= max(8 * len(key), 1 << 16):
        uniq, code = np.unique(key, return_inverse=True)
        return uniq, code.ravel()
    present = np.zeros(int(key.max()) + 1, dtype=bool)
    present[key] = True
    place = np.cumsum(present) - 1
    return np.flatnonzero(present), place[key]


def rank_sums(sums: dict) -> dict:
    """Per rank (in order): its steps' sums added (wait stays NaN: no step records one)."""
    ranks, at = np.unique(sums["rank"], return_inverse=True)
    out = {"rank": ranks}
    for col in ("window", "compute", "comm", "overlapped", "union"):
        out[col] = np.bincount(at.ravel(), weights=sums[col], minlength=len(ranks))
    out["wait"] = np.full(len(ranks), np.nan)
    return out


def report_figures(window, compute, comm, overlapped, wait, union) -> dict:
    """Summed us per window or rank -> the report's ms and % columns (window_ms ... bubble_pct)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return {"window_ms": window * US_MS, "compute_ms": compute * US_MS, "comm_ms": comm * US_MS,
                "overlapped_ms": overlapped * US_MS, "exposed_comm_ms": (comm - overlapped) * US_MS,
                "wait_ms": wait * US_MS, "idle_ms": (window - union) * US_MS,  # neither compute nor in flight
                "overlap_pct": np.where(comm > 0, 100 * overlapped / comm, np.nan),
                "bubble_pct": np.where(window > 0, 100 * (1 - compute / window), np.nan)}


def rank_rows(per_rank: dict) -> dict:
    """The main table's rows of a GPU trace, by rank (metrics' columns)."""
    p = per_rank
    return {"rank": p["rank"], **report_figures(p["window"], p["compute"], p["comm"], p["overlapped"], p["wait"],
                                                p["union"])}


def gpu_rows(per_rank: dict) -> dict:
    """The GPU table (streams.GPU_COLUMNS): the rank's GPU window, compute and comm kernels merged, their
    intersection, the comm no compute kernel ran beside and the window no compute kernel covered."""
    window, comp, comm, both = (per_rank[c] for c in ("window", "compute", "comm", "overlapped"))
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(comm > 0, 100 * both / comm, np.nan)
    return {"rank": per_rank["rank"], "gpu_window_ms": window * US_MS, "kernel_compute_ms": comp * US_MS,
            "kernel_comm_ms": comm * US_MS, "kernel_overlapped_ms": both * US_MS,
            "gpu_exposed_comm_ms": (comm - both) * US_MS, "compute_idle_ms": (window - comp) * US_MS,
            "kernel_overlap_pct": pct}


def stream_rows(k: Kernels, per_rank: dict) -> dict:
    """The streams table (streams.STREAM_COLUMNS), by rank then stream name: kernels, comm kernels, busy
    time (its kernels merged), the comm part of it and busy as a % of the rank's GPU window."""
    ranks, rcode = dense_codes(k.rank)   # a table lookup where ranks are few: no sort of every kernel
    n_streams = max(len(k.streams), 1)
    rcode = rcode.astype(np.int64, copy=False)   # (rank, stream) packed in place: one int64 a kernel
    rcode *= n_streams
    rcode += k.stream
    pairs, code = dense_codes(rcode)
    del rcode
    # one sweep: busy is the union of compute (class 0) and comm (class 1), its comm part class 1 merged
    keys, lengths, _, busy = sweep(code, k.ts, k.end, k.comm.view(np.int8), 2)
    rank = ranks[pairs[keys] // n_streams]
    stream = [k.streams[p % n_streams] for p in pairs[keys]]
    window = dict(zip(per_rank["rank"].tolist(), per_rank["window"].tolist()))
    window = np.array([window.get(r, np.nan) for r in rank.tolist()], dtype=float)
    busy_ms = busy * US_MS
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(window > 0, 100 * busy_ms / (window * US_MS), np.nan)
    rows = {"rank": rank, "stream": np.array(stream, dtype=object),
            "kernels": np.bincount(code, minlength=len(pairs))[keys],
            "comm_kernels": np.bincount(code[k.comm], minlength=len(pairs))[keys],
            "busy_ms": busy_ms, "comm_busy_ms": lengths[:, 1] * US_MS, "busy_pct": pct}
    order = sorted(range(len(keys)), key=lambda i: (rank[i], stream[i]))
    return {c: v[order] for c, v in rows.items()}


def family_rows(k: Kernels) -> dict:
    """Per rank and comm family (in that order): comm kernels matched and their summed time (ms)."""
    fam_names = sorted({f for f in k.families if f is not None})
    fam_code = np.array([fam_names.index(f) if f is not None else -1 for f in k.families] + [-1])[k.name[k.comm]]
    rank, dur = k.rank[k.comm][fam_code >= 0], k.dur[k.comm][fam_code >= 0]
    fam_code = fam_code[fam_code >= 0]
    pairs, at = np.unique(rank.astype(np.int64) * (len(fam_names) + 1) + fam_code + 1, return_inverse=True)
    at = at.ravel()
    fam = [fam_names[p % (len(fam_names) + 1) - 1] for p in pairs]
    return {"rank": pairs // (len(fam_names) + 1), "family": np.array(fam, dtype=object),
            "kernels": np.bincount(at, minlength=len(pairs)),
            "kernel_ms": np.bincount(at, weights=dur, minlength=len(pairs)) * 1e-3}


# ---------------------------------------------------------------- HTA's figure, under HTA's rule


def hta_classes(names) -> np.ndarray:
    """Per distinct GPU event name, HTA's class: 1 comm (^nccl.*Kernel), -1 neither (Memcpy / Memset),
    0 compute; one more entry, -1, for a missing name (code -1)."""
    return np.array([1 if n is not None and HTA_COMM.match(str(n)) else
                     -1 if n is None or HTA_MEMORY.search(str(n)) else 0 for n in names] + [-1], dtype=np.int8)


def hta_kept(gpu_rank, gpu_corr, cpu_rank, cpu_ts, cpu_corr, step_rank, step_name, step_ts, step_end,
             include_last_profiler_step: bool = False) -> np.ndarray:
    """Per GPU event, whether HTA's filter (Trace.load_traces) keeps it: with two or more distinct
    ProfilerStep#N names (step_*: the CPU events so named), only kernels launched (by correlation id) from
    CPU events that start before their rank's last step begins; include_last_profiler_step: up to its
    end. CPU times rounded inward to whole us as HTA's parser does."""
    if len(set(step_name)) < 2:  # HTA filters nothing with fewer than two steps
        return np.ones(len(gpu_rank), bool)
    kept = hta_launches(cpu_rank, cpu_ts, hta_bounds(step_rank, step_ts, step_end, include_last_profiler_step),
                        include_last_profiler_step)
    return launched_by(gpu_rank, gpu_corr, cpu_rank[kept], cpu_corr[kept])


def hta_bounds(step_rank, step_ts, step_end, include_last_profiler_step: bool = False) -> dict:
    """{rank: the bound of the launches HTA keeps}: its last ProfilerStep's start, or, including the last
    step, the latest step end (rounded inward to whole us, as HTA's parser does)."""
    edge = np.floor(step_end) if include_last_profiler_step else np.ceil(step_ts)
    return {r: edge[step_rank == r].max() for r in np.unique(step_rank).tolist()}


def hta_launches(cpu_rank, cpu_ts, bounds: dict, include_last_profiler_step: bool = False) -> np.ndarray:
    """Per CPU event, whether HTA keeps what it launches: it starts (rounded up to whole us) before its
    rank's bound (hta_bounds; up to it, including the last step). A rank without steps has no bound and
    launches nothing HTA keeps."""
    bound = np.full(len(cpu_rank), np.nan)
    for r, b in bounds.items():
        bound[cpu_rank == r] = b
    start = np.ceil(cpu_ts)
    return (start <= bound) if include_last_profiler_step else (start < bound)


def launched_by(gpu_rank: np.ndarray, gpu_corr: np.ndarray, cpu_rank: np.ndarray,
                cpu_corr: np.ndarray) -> np.ndarray:
    """Per GPU event: whether a CPU event of its rank carries its correlation id (NaN matches nothing).
    Each (rank, id) pair is packed into one int64 (the ids themselves when they are whole numbers under
    2**40 and the ranks under 2**22, else their codes among the distinct ids and ranks), so one sorted
    np.isin answers."""
    gpu_rank, cpu_rank = np.asarray(gpu_rank), np.asarray(cpu_rank)
    gpu_corr, cpu_corr = np.asarray(gpu_corr, dtype=float), np.asarray(cpu_corr, dtype=float)
    cpu_corr_known = ~np.isnan(cpu_corr)
    cpu_rank, cpu_corr = cpu_rank[cpu_corr_known], cpu_corr[cpu_corr_known]
    gpu_known = ~np.isnan(gpu_corr)
    ids = np.concatenate([cpu_corr, gpu_corr[gpu_known]])
    ranks = np.concatenate([cpu_rank, gpu_rank[gpu_known]])
    packable = (not len(ids) or (ids.min() >= 0 and ids.max() < 2 ** 40 and (ids == np.floor(ids)).all()
                                 and ranks.min() >= 0 and ranks.max() < 2 ** 22))
    if not packable:  # any ids or ranks: numbered by their place among the distinct ones
        n_cpu = len(cpu_corr)
        id_code = np.unique(ids, return_inverse=True)[1].ravel()
        rank_code = np.unique(ranks, return_inverse=True)[1].ravel()
        cpu_corr, cpu_rank = id_code[:n_cpu], rank_code[:n_cpu]
        gpu_corr, gpu_rank = np.full(len(gpu_rank), np.nan), np.zeros(len(gpu_rank), np.int64)
        gpu_corr[gpu_known], gpu_rank[gpu_known] = id_code[n_cpu:], rank_code[n_cpu:]
    pack = lambda rank, corr: (rank.astype(np.int64) << 40) | corr.astype(np.int64)  # noqa: E731
    out = np.zeros(len(gpu_rank), bool)
    out[gpu_known] = np.isin(pack(gpu_rank[gpu_known], gpu_corr[gpu_known]), pack(cpu_rank, cpu_corr))
    return out


def hta_overlap_pct(ranks, gpu_rank, gpu_cls, gpu_ts, gpu_end, owned: bool = False) -> np.ndarray:
    """HTA's comm-comp overlap % of each rank in `ranks` (NaN: no comm) from the GPU events it kept
    (hta_kept) and their classes (hta_classes): each class merged per rank, times rounded inward to whole
    us (start up, end down; an event shorter than that vanishes). owned: gpu_ts and gpu_end are the
    caller's copies, rounded in place (a big trace's kept kernels are not copied again)."""
    ts = np.ceil(gpu_ts, out=gpu_ts if owned else None)
    end = np.floor(gpu_end, out=gpu_end if owned else None)
    keep = (gpu_cls >= 0) & (end > ts)
    if not keep.all():   # one array at a time, each freed before the next is cut
        ts = ts[keep]
        end = end[keep]
        gpu_rank = gpu_rank[keep]
        gpu_cls = gpu_cls[keep]
    out = np.full(len(ranks), np.nan)
    if keep.any():
        keys, lengths, inter0, _ = sweep(gpu_rank, ts, end, gpu_cls, 2)
        with np.errstate(divide="ignore", invalid="ignore"):
            pct = np.where(lengths[:, 1] > 0, 100 * inter0[:, 1] / lengths[:, 1], np.nan)
        place = {r: i for i, r in enumerate(np.asarray(ranks).tolist())}
        for key, p in zip(keys.tolist(), pct.tolist()):
            if key in place:
                out[place[key]] = p
    return out
