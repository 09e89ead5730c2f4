"""`partui bench blame-scale`: `partui blame` at a thousand ranks (issue 36, item 3).

It tiles ByteDance's SE trace (a job of 128 ranks: dp 32 x pp 2 x sequence-parallel 2; the table
records one rank per worker, 64 workers) side by side into a bigger job: copy i is the same ops
with dp ranks shifted by i x 32 and ranks by i x 128, so 1,024 ranks are 8 copies, 512 workers
(dp 256 x pp 2) in the table. Written as parquet (and its meta yaml) to a temp
folder, then `partui blame` runs on it as its own process, as a user runs it:
    wall        seconds, the whole process (reading, graph, replays, printing)
    cpu         user + system seconds of that process
    peak RSS    its largest resident set, MB (VmHWM, read every 20 ms while it runs)
Each beside its goal (wall <= 20 s at 1,024 ranks). The copies are exact, so the tiled job's
culprits are the source's: the same top dp rank, stage, op type and worst worker (a copy's twin
ties it and the lower number, the original, sorts first). `same culprits` checks that against
`partui blame` on the source itself, timed the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from partui.analysis.reading.op_table import meta_path, read_meta
from partui.bench.harness import print_rows

REAL = Path(__file__).resolve().parents[2].parent / "shared" / "real-traces" / "bytedance-straggler"
GOAL_WALL_S = {"source": 2.0, "tiled": 20.0}      # issue 36, on a quiet 2-core machine
CULPRITS = ("top dp rank", "top stage", "top op type", "worst worker")


def tile(source: str, ranks: int, folder: str) -> str:
    """Write `trace-<name>x<copies>.parquet` (+ its meta yaml) tiling `source` to `ranks`
    workers; return its path."""
    import pandas as pd

    df = pd.read_parquet(source)
    meta = read_meta(meta_path(source))
    world, dps = world_of(df, meta), int(df["dp_rank"].max()) + 1
    if ranks % world:
        raise ValueError(f"--ranks {ranks} is not a multiple of the source's {world} ranks: "
                         f"pick one, e.g. {world * max(1, ranks // world)}")
    copies = ranks // world
    parts = []
    for i in range(copies):
        part = df.copy()
        part["rank"] = (part["rank"].astype("int64") + i * world)
        part["dp_rank"] = (part["dp_rank"].astype("int64") + i * dps)
        parts.append(part)
    out = pd.concat(parts, ignore_index=True)
    name = Path(source).stem.removeprefix("trace-") + f"x{copies}"
    path = os.path.join(folder, f"trace-{name}.parquet")
    out.to_parquet(path)
    if meta:
        meta.pop("_path")
        meta["dp_size"] *= copies
        meta["world_size"] = world * copies
        meta["trial_name"] = name
        with open(os.path.join(folder, f"meta-{name}.yaml"), "w", encoding="utf-8") as f:
            f.writelines(f"{k}: {v}\n" for k, v in meta.items())
    return path


def world_of(df, meta: dict) -> int:
    """The job's ranks: its meta's world_size, else the highest rank + 1 (the op-level table
    records one rank per worker; its tp and sequence peers keep their numbers)."""
    return int(meta.get("world_size") or int(df["rank"].max()) + 1)


def _hwm_kb(pid: int) -> int:
    """The process's own peak resident set so far (VmHWM, kB; 0 where /proc has none). Not
    ru_maxrss: Linux carries the parent's resident set across fork and exec into the child's."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"--format\0json" not in f.read():
                return 0                        # not yet exec'd: still the bench's own image
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def timed_blame(path: str, timeout_s: float) -> dict:
    """`partui blame PATH --format json` as its own process: wall, cpu (its rusage, from wait4),
    peak RSS (its VmHWM, read while it runs), its summary."""
    cmd = [sys.executable, "-m", "partui", "blame", path, "--format", "json"]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        peak_kb = 0
        while True:
            peak_kb = max(peak_kb, _hwm_kb(proc.pid))
            pid, status, use = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout_s:
                proc.kill()
                os.wait4(proc.pid, 0)
                raise RuntimeError(f"partui blame {path} ran past {timeout_s:.0f} s")
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, why = out.read(), err.read()
    if proc.returncode:
        raise RuntimeError(f"partui blame {path} exited {proc.returncode}: {why.strip()[-500:]}")
    doc = json.loads(text)
    return {"wall_s": wall, "cpu_s": use.ru_utime + use.ru_stime,
            "peak_rss_mb": (peak_kb or use.ru_maxrss) / 1024,
            "summary": {r["figure"]: r["value"] for r in doc["summary"]}}


def run_blame_scale(ranks: int = 1024, source: str | None = None, folder: str | None = None,
                    timeout_s: float = 600.0) -> dict:
    """Time `partui blame` on `source` (default SE) and on its tiling to `ranks` workers.
    Returns {"source": row, "tiled": row, "same_culprits": bool, "culprits": {...}}; each row:
    what, ranks, wall_s, cpu_s, peak_rss_mb, goal_wall_s."""
    source = str(source or REAL / "trace-SE.parquet")
    if not os.path.isfile(source):
        raise FileNotFoundError(f"{source}: no such trace (../shared/real-traces beside the "
                                f"checkout holds SE); give --source PATH")
    own = folder is None
    folder = folder or tempfile.mkdtemp(prefix="partui-blame-scale-")
    try:
        tiled = tile(source, ranks, folder)
        rows = {what: timed_blame(path, timeout_s)
                for what, path in (("source", source), ("tiled", tiled))}
    finally:
        if own:
            shutil.rmtree(folder, ignore_errors=True)
    import pandas as pd

    world = world_of(pd.read_parquet(source, columns=["rank"]), read_meta(meta_path(source)))
    culprits = {k: (rows["source"]["summary"][k], rows["tiled"]["summary"][k]) for k in CULPRITS}
    out = {"culprits": culprits, "same_culprits": all(a == b for a, b in culprits.values())}
    for what, n in (("source", world), ("tiled", ranks)):
        r = rows[what]
        out[what] = {"what": f"{Path(source).stem if what == 'source' else 'tiled'}",
                     "ranks": n, "wall_s": r["wall_s"], "goal_wall_s": GOAL_WALL_S[what],
                     "cpu_s": r["cpu_s"], "peak_rss_mb": r["peak_rss_mb"],
                     "slowdown": r["summary"]["slowdown"]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="partui bench blame-scale", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024, help="ranks of the tiled job, a multiple "
                    "of the source's (default 1024: 8 copies of SE's 128)")
    ap.add_argument("--source", help="the op-level trace to tile (default: ../shared/real-traces/"
                    "bytedance-straggler/trace-SE.parquet)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args(argv)
    if args.ranks < 1:
        ap.error(f"--ranks {args.ranks} must be >= 1: e.g. --ranks 1024")
    try:
        res = run_blame_scale(args.ranks, args.source)
    except (FileNotFoundError, ValueError) as e:
        ap.error(str(e))
    except RuntimeError as e:
        print(f"partui bench blame-scale: {e}", file=sys.stderr)
        return 1
    rows = [res["source"], res["tiled"]]
    for r in rows:
        r["verdict"] = "ok" if r["wall_s"] <= r["goal_wall_s"] else "over the goal"
    if args.json:
        print(json.dumps(res))
    else:
        print_rows(rows, ["what", "ranks", "wall_s", "goal_wall_s", "cpu_s", "peak_rss_mb",
                          "slowdown", "verdict"],
                   "partui blame, whole process: wall and CPU seconds, peak RSS (MB)", False)
        print("culprits (source, tiled): " + "; ".join(f"{k} {a} / {b}" for k, (a, b) in
                                                       res["culprits"].items())
              + f"; same: {'yes' if res['same_culprits'] else 'NO'}")
    ok = res["same_culprits"] and all(r["wall_s"] <= r["goal_wall_s"] for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
