"""`partui bench app`: time from `partui` to its first frame (target <= 1.5 s), and the delay from
a step's end to the refreshed screen at world 4 (target <= 300 ms).

First frame: `python -m partui` in a pseudo-terminal, timed until the header's text is drawn;
the peer is `python -c "import torch"` (what an eager torch import alone would cost).
Refresh: the app under Textual's headless driver, a world-4 plan, each step's end (controller
reply) to (a) rank cards and loss redrawn, (b) snapshot taken and the rank tabs redrawn.
"""
from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import pty
import select
import statistics
import struct
import subprocess
import sys
import termios
import time

from partui.app.main import PartuiApp
from partui.app.screens.run import RunScreen

MARKER = b"distributed training"


def first_frame_s(cols: int = 100, rows: int = 30, timeout_s: float = 30.0) -> tuple[float, float]:
    """(seconds to the first frame, seconds from 'q' to exit) of `python -m partui` in a pty."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "partui"], stdin=slave, stdout=slave,
                            stderr=slave, env=env, close_fds=True, start_new_session=True)
    os.close(slave)
    buf, t_frame = b"", None
    try:
        while time.perf_counter() - t0 < timeout_s:
            r, _, _ = select.select([master], [], [], 0.05)
            if r:
                try:
                    buf += os.read(master, 65536)
                except OSError:
                    break
                if MARKER in buf:
                    t_frame = time.perf_counter() - t0
                    break
        if t_frame is None:
            raise RuntimeError(f"no first frame within {timeout_s} s; output: {buf[-500:]!r}")
        time.sleep(1.0)
        t1 = time.perf_counter()
        os.write(master, b"q")
        while proc.poll() is None and time.perf_counter() - t1 < timeout_s:
            if select.select([master], [], [], 0.05)[0]:
                try:
                    os.read(master, 65536)
                except OSError:
                    pass
        return t_frame, time.perf_counter() - t1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        os.close(master)


def import_torch_s() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - t0


async def refresh_delays(preset: str, world: int, steps: int) -> dict:
    app = PartuiApp()
    async with app.run_test(size=(100, 30)) as pilot:
        async def until(cond, what, timeout=120.0):
            t0 = time.monotonic()
            while not cond():
                if time.monotonic() - t0 > timeout:
                    raise RuntimeError(f"timed out waiting for {what}")
                await pilot.pause(0.02)
        await until(lambda: app.engine_ready, "the engine")
        fields = {"dp": world} if preset in ("dp", "zero1", "zero2", "zero3") else {}
        app.launch_world(preset, "tiny", fields)
        await until(lambda: isinstance(app.screen, RunScreen) and not app.busy, "the launch")
        step_ms, t_step = [], []
        for _ in range(steps):
            n = len(app.inspect_ms)
            t = time.perf_counter()
            app.action_step(1)
            await until(lambda: len(app.inspect_ms) > n and not app.busy, "a step")
            t_step.append(1e3 * (time.perf_counter() - t))
            step_ms.append(app.world.history[-1]["step_ms"])
        out = {"refresh_ms": list(app.refresh_ms), "inspect_ms": list(app.inspect_ms),
               "step_ms": step_ms, "key_to_done_ms": t_step, "plan": app.world.current_plan.describe()}
        await app.action_quit()
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="partui bench app", description=__doc__)
    ap.add_argument("--runs", type=int, default=3, help="first-frame runs (median reported)")
    ap.add_argument("--preset", default="dp", help="plan for the refresh test (dp, zero2, ...)")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)
    frames = [first_frame_s() for _ in range(args.runs)]
    ff = statistics.median(f for f, _ in frames)
    quit_s = statistics.median(q for _, q in frames)
    torch_s = statistics.median(import_torch_s() for _ in range(args.runs))
    d = asyncio.run(refresh_delays(args.preset, args.world, args.steps))
    med = statistics.median
    rows = [("first frame (s)", f"{ff:.3f}", "<= 1.5", f"import torch {torch_s:.3f} s",
             f"{ff / torch_s:.2f}x"),
            ("quit, world-less (s)", f"{quit_s:.3f}", "", "", ""),
            ("step end -> cards (ms)", f"{med(d['refresh_ms']):.1f} (max {max(d['refresh_ms']):.1f})",
             "<= 300", f"step {med(d['step_ms']):.1f} ms", f"{med(d['refresh_ms']) / med(d['step_ms']):.2f}x"),
            ("step end -> tabs (ms)", f"{med(d['inspect_ms']):.1f} (max {max(d['inspect_ms']):.1f})",
             "<= 300", "(incl. snapshot)", f"{med(d['inspect_ms']) / med(d['step_ms']):.2f}x")]
    print(f"partui bench app · {d['plan']} · world {args.world} · {args.steps} steps · "
          f"{os.cpu_count()} cpus · load {os.getloadavg()[0]:.1f}")
    print(f"{'measure':24} {'value':22} {'target':8} {'peer':24} ratio")
    for r in rows:
        print(f"{r[0]:24} {r[1]:22} {r[2]:8} {r[3]:24} {r[4]}")
    print(f"command: partui bench app --runs {args.runs} --preset {args.preset} --world "
          f"{args.world} --steps {args.steps}")
    ok = ff <= 1.5 and med(d["refresh_ms"]) <= 300
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
