"""Under torchrun, a hang named within 10 s and the world ended: the heartbeat of partui's own
worlds (partui/diagnosis/flight_gather.py's stop rule), carried by the launcher's store instead of shared
memory, because torchrun's ranks have no controller.

Each rank's watcher thread publishes, every WATCH_S, the wall time its current blocking wait began
and the wall time of its last issued op (`at/RANK`), and reads every rank's. The world has stopped
when some rank has been blocked HANG_S and no rank has issued an op for as long (a straggler ends
its wait sooner; a rank that finished counts as issuing nothing). The first rank to see it, or a
rank whose step failed, claims `stop` in the store; then every rank writes torch's flight recorder
dump (PREFIX<rank>) and its partui records (`part/RANK`), the claimant gathers them into one dump,
prints partui's verdict and torch's beside it, says `done`, and every watcher exits 1, so torchrun
ends the job with nothing left running. gloo's own timeout (--timeout) is never waited for.
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import select
import signal
import sys
import tempfile
import threading
import time

from kernels import comm
from kernels.comm import flight
from partui.diagnosis import flight_gather
from partui.diagnosis.doctor import render, verdict
from partui.diagnosis.torch_fr import to_dump
from planning.flight_codes import BLOCK, decode

HANG_S = flight_gather.HANG_S    # the same rule as partui's own worlds
WATCH_S = 0.2                    # how often a watcher publishes and looks
GATHER_S = 3.0                   # how long the claimant waits for every rank's records


def wall_ns(perf_ns: int) -> int:
    """A perf_counter_ns time as wall time (ranks on one host share it; across hosts, NTP's)."""
    return time.time_ns() - (time.perf_counter_ns() - perf_ns) if perf_ns else 0


def stopped(at: dict, now_ns: int, hang_s: float = HANG_S) -> tuple[int, float] | None:
    """(the rank blocked longest, seconds blocked) when the world has stopped, else None.
    at: {rank: {"waiting": wall ns its wait began or 0, "issued": wall ns of its last op or 0}}."""
    limit = hang_s * 1e9
    last = max((a["issued"] for a in at.values()), default=0)
    blocked = {r: now_ns - a["waiting"] for r, a in at.items()
               if a["waiting"] and now_ns - a["waiting"] > limit}
    if not blocked or now_ns - last <= limit:
        return None
    r = max(blocked, key=blocked.get)
    return r, blocked[r] / 1e9


class TorchrunWatch:
    """One rank's watcher; `failed(e)` from the main thread when its step raised."""

    def __init__(self, rank: int, world: int, fr_prefix: str, dump_path: str | None):
        self.rank, self.world, self.fr_prefix, self.dump_path = rank, world, fr_prefix, dump_path
        run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.store = comm.launcher_store(f"partui-watch/{run}/{attempt}/")
        self.rows_prefix = os.path.join(tempfile.gettempdir(), f"partui-rows-{run}-{attempt}-")
        self.finished = False
        self._lock = threading.Lock()       # one stop per rank: the watcher's or the main thread's
        self._stopping = False
        self._done = False                  # this rank's part of a stop is over
        self._in_main = False               # the main thread is doing the stop (failed())
        self._wake = None
        self._closing = threading.Event()

    def start(self) -> TorchrunWatch:
        """From the main thread: the rows file attached, SIGTERM routed to the watcher, its thread
        started."""
        self._rows = mirror_file(f"{self.rows_prefix}{self.rank}")
        flight.recorder.attach_mirror(self._rows, 0)
        # torchrun SIGTERMs the others when a rank dies (gloo aborts a rank on a size mismatch);
        # the main thread may sit in a collective, so the signal's byte wakes the watcher instead
        r, w = os.pipe()
        os.set_blocking(w, False)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        self._wake = r
        self._thread = threading.Thread(target=self._loop, daemon=True, name="torchrun-watch")
        self._thread.start()
        return self

    def close(self) -> None:
        """A finished rank's watcher stopped and its store connection closed before the
        interpreter ends (a store torn down under a running thread aborted the process)."""
        self._closing.set()
        self._thread.join(timeout=5.0)
        self.store = None

    def _on_term(self, *_) -> None:
        """SIGTERM seen by the main thread (when not blocked in a collective): the watcher does
        the gathering; wait for it, then end as torchrun asked."""
        if self._in_main:          # the main thread is gathering (its step failed): let it end
            return
        deadline = time.monotonic() + GATHER_S + 10
        while not self._done and time.monotonic() < deadline:
            time.sleep(0.05)
        os._exit(1)

    # ------------------------------------------------------------ the loop
    def _publish(self) -> None:
        fr = flight.recorder
        ring = fr.ring
        try:
            last = ring[-1].t_issue if ring else 0
        except IndexError:
            last = 0
        waiting = 0 if self.finished or not fr.enabled else fr.waiting_since()
        self.store.set(f"at/{self.rank}", json.dumps({"waiting": wall_ns(waiting),
                                                      "issued": wall_ns(last)}))

    def _look(self) -> None:
        keys = [f"at/{r}" for r in range(self.world)]
        if not self.store.check(keys):
            return
        at = {r: json.loads(self.store.get(k)) for r, k in enumerate(keys)}
        found = stopped(at, time.time_ns())
        if found is not None:
            r, s = found
            self._claim(f"the world stopped making progress under torchrun: rank {r} blocked "
                        f"{s:.1f} s with no op issued anywhere for {HANG_S:.0f} s")

    def _loop(self) -> None:
        try:
            while not self._closing.is_set():
                self._publish()
                if self.store.check(["stop"]):
                    self._stop()
                    return
                self._look()
                woke, _, _ = select.select([self._wake], [], [], WATCH_S)
                if woke and signal.SIGTERM in os.read(self._wake, 64):
                    self._claim("torchrun is ending the job (SIGTERM): a rank exited")
                    self._stop()
                    return
        except Exception as e:  # noqa: BLE001 - the store gone: torchrun is ending the job
            print(f"partui run: rank {self.rank}'s hang watcher stopped ({type(e).__name__}: "
                  f"{e})", file=sys.stderr, flush=True)

    # ------------------------------------------------------------ stopping
    def _claim(self, reason: str) -> bool:
        """Claim the stop with reason; True when this rank is the one to gather and print."""
        won = self.store.compare_set("stop", "", reason).decode() == reason
        if won:
            self.store.set("claimant", str(self.rank))
        return won

    def failed(self, e: BaseException) -> None:
        """The main thread's step raised: every rank's records gathered and the verdict printed
        before the error goes on (torchrun ends the job when this rank exits)."""
        self._in_main = True
        self._claim(f"rank {self.rank}'s step failed: {type(e).__name__}: "
                    f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}")
        self._stop(exit_after=False)

    def finish(self) -> None:
        """The run ended on this rank: its records left for a claimant (another rank may still
        hang waiting for it), and it counts as issuing nothing from now on."""
        self.finished = True
        self._write_part()
        remove(f"{self.rows_prefix}{self.rank}")

    def _write_part(self) -> None:
        comm.dump_torch_flight_recorder(f"{self.fr_prefix}{self.rank}")
        self.store.set(f"part/{self.rank}", json.dumps(flight.dump(self.rank,
                                                                   time.perf_counter_ns())))

    def _stop(self, exit_after: bool = True) -> None:
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        self._write_part()
        if self.store.get("claimant").decode() == str(self.rank):
            self.gather_and_print(self.store.get("stop").decode())
            self.store.set("done", "1")
        else:
            self._wait(["done"], GATHER_S + 5.0)
        self._done = True
        if exit_after:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    def _wait(self, keys: list[str], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.store.check(keys):
                return True
            time.sleep(0.05)
        return False

    def gather_and_print(self, reason: str) -> dict:
        """Every rank's records that came within GATHER_S as one partui dump (written to
        dump_path), and partui's verdict printed beside the verdict on torch's own dumps."""
        deadline = time.monotonic() + GATHER_S
        ranks, pending = [], set(range(self.world))
        while pending and time.monotonic() < deadline:
            for r in sorted(pending):
                if self.store.check([f"part/{r}"]):
                    ranks.append(json.loads(self.store.get(f"part/{r}")))
                    pending.discard(r)
            time.sleep(0.05)
        for r in sorted(pending):        # a rank that died: the rows it left in its file
            rows = read_rows(f"{self.rows_prefix}{r}")
            if rows:
                ranks.append({"rank": r, "step": rows[-1]["step"], "span": None, "waiting": None,
                              "groups": {}, "records": rows, "from": "its rows file",
                              "t_dump": time.perf_counter_ns(), "t_dump_wall": time.time_ns()})
        if pending:
            reason += (f"; rank(s) {sorted(pending)} gave no records (died or frozen): their last "
                       f"ops come from the rows they left in {self.rows_prefix}RANK")
        dump = {"format": "partui-flight", "world": self.world, "reason": reason,
                "ranks": sorted(ranks, key=lambda rk: rk["rank"]), "absent": sorted(pending)}
        if self.dump_path:
            flight_gather.write(dump, self.dump_path)
        print(f"partui run: {reason}\n" + flight_gather.report(dump, self.dump_path),
              file=sys.stderr, flush=True)
        print(torch_says(self.fr_prefix, self.world), file=sys.stderr, flush=True)
        for r in range(self.world):
            remove(f"{self.rows_prefix}{r}")
        return dump


def mirror_file(path: str):
    """An int64 array of BLOCK over a file (planning.flight_codes' rows): what a rank writes there
    outlives it, as the shared rows of partui's own worlds do."""
    with open(path, "wb") as f:
        f.truncate(BLOCK * 8)
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), BLOCK * 8)
    return (ctypes.c_int64 * BLOCK).from_buffer(mm)


def remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def read_rows(path: str) -> list[dict]:
    """The records a rank left in its rows file ([] when none)."""
    try:
        with open(path, "rb") as f:
            data = f.read(BLOCK * 8)
    except OSError:
        return []
    if len(data) < BLOCK * 8:
        return []
    return decode(memoryview(data).cast("q"))


def torch_says(prefix: str, world: int) -> str:
    """The verdict on torch's own dumps of this world (PREFIX<rank>), as lines led by their source."""
    try:
        lines = render(verdict(to_dump(prefix, world)))
    except (OSError, ValueError) as e:
        return f"torch's flight recorder: no dumps read at {prefix} ({e})"
    return "\n".join([f"torch's flight recorder (partui doctor {prefix}):"] +
                     [f"  {ln}" for ln in lines])
