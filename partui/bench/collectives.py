"""`partui bench collectives`: bus bandwidth of the hand collectives (kernels.comm.collectives) against
gloo's, measured interleaved in the same world so machine noise hits both alike.

Bus bandwidth, the nccl-tests definition: busbw = size / time x factor, factor 2(N-1)/N for
all-reduce, (N-1)/N for reduce-scatter and all-gather (size = the full tensor), 1 for broadcast.

Each world size is one forked gloo world (partui.world.launch.run_world).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from kernels import comm
from partui.world.launch import run_world

SIZES = ["1K", "16K", "256K", "1M", "4M", "16M", "64M"]
OPS = ("all_reduce", "reduce_scatter", "all_gather")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


# ---------------------------------------------------------------- measuring

def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("B")
    if not s or not (s[:-1] if s[-1] in units else s).isdigit():
        raise ValueError(f"size {s!r}: write bytes like 4096, 64K or 16M")
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def _one(op: str, t, out, group):
    if op == "all_reduce":
        comm.all_reduce(t, group)
    elif op == "reduce_scatter":
        comm.reduce_scatter(out, t, group)
    elif op == "all_gather":
        comm.all_gather(out, t, group)
    else:
        comm.broadcast(t, group.ranks[0], group)


def _measure(rank: int, size: int, ops, sizes, iters: int, warmup: int) -> list[dict]:
    """Per (op, bytes): median seconds of native and hand, runs alternated so both see the same load."""
    group, rows = comm.world_group(), []
    for op in ops:
        for nbytes in sizes:
            n = max(size, nbytes // 4 // size * size)     # fp32 elements, divisible by N
            big = torch.ones(n)                            # [n] the full tensor
            small = torch.ones(n // size)                  # [n / N] one rank's piece
            t, out = (big, small) if op == "reduce_scatter" else \
                (small, big) if op == "all_gather" else (big, None)
            times = {"native": [], "hand": []}
            for i in range(warmup + iters):
                for mode in ("native", "hand") if i % 2 == 0 else ("hand", "native"):
                    comm.set_collectives(mode)
                    comm.barrier()
                    t0 = time.perf_counter()
                    _one(op, t, out, group)
                    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                    comm.set_collectives("native")
                    comm.all_reduce(dt, group, "max")      # an op is done when its slowest rank is
                    if i >= warmup:
                        times[mode].append(dt.item())
            rows.append({"op": op, "world": size, "bytes": n * 4,
                         "native_s": statistics.median(times["native"]),
                         "hand_s": statistics.median(times["hand"])})
    return rows if rank == 0 else []


def busbw(op: str, nbytes: int, seconds: float, n: int) -> float:
    """GB/s, the nccl-tests bus bandwidth."""
    return nbytes / seconds * BUS_FACTOR[op](n) / 1e9


def _fmt_bytes(b: int) -> str:
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= k:
            return f"{b / k:.0f}{unit}"
    return f"{b}"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="partui bench collectives", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="2,4", help="world sizes, e.g. 2,4")
    ap.add_argument("--ops", default=",".join(OPS), help=f"some of {', '.join(BUS_FACTOR)}")
    ap.add_argument("--sizes", default=",".join(SIZES), help="bytes per op, e.g. 1K,16M,64M")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600.0)
    a = ap.parse_args(argv)
    try:
        worlds = [int(w) for w in a.worlds.split(",")]
        sizes = [parse_size(s) for s in a.sizes.split(",")]
    except ValueError as e:
        ap.error(str(e))
    ops = a.ops.split(",")
    bad = [o for o in ops if o not in BUS_FACTOR]
    if bad or min(worlds) < 2 or a.iters < 1:
        ap.error(f"ops {bad} unknown (pick from {', '.join(BUS_FACTOR)}), or a world < 2, "
                 f"or --iters < 1")
    print(f"{'op':<15}{'world':>6}{'bytes':>8}{'gloo GB/s':>11}{'hand GB/s':>11}{'hand/gloo':>11}")
    for w in worlds:
        try:
            rows = run_world(w, _measure, ops, sizes, a.iters, a.warmup, timeout_s=a.timeout,
                             what=f"collectives world of {w}")[0]
        except (RuntimeError, TimeoutError) as e:
            print(f"partui bench collectives: {e}", file=sys.stderr)
            return 1
        for row in rows:
            g = busbw(row["op"], row["bytes"], row["native_s"], w)
            h = busbw(row["op"], row["bytes"], row["hand_s"], w)
            print(f"{row['op']:<15}{w:>6}{_fmt_bytes(row['bytes']):>8}{g:>11.3f}{h:>11.3f}"
                  f"{h / g:>11.2f}", flush=True)
    print(f"busbw = size / time x 2(N-1)/N (all-reduce), (N-1)/N (reduce-scatter, all-gather); "
          f"median of {a.iters}, interleaved\ncommand: partui bench collectives --worlds {a.worlds} "
          f"--ops {a.ops} --sizes {a.sizes} --iters {a.iters}")
    return 0
