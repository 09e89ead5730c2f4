"""`Controller`: the held world's end of the pipes. It starts its ranks through the one launcher
(partui.world.launch, a fork server that has imported torch once, so a 4-rank world is ready in about
the time of one torch import), sends each command to every rank and gathers the replies. Every
wait is bounded; a rank that raises or dies surfaces as RankError with its rank and traceback, a
silent heartbeat as RankStalled; close() leaves no process behind.
"""
from __future__ import annotations

import shutil
import tempfile
import time

from partui.diagnosis import flight_gather
from partui.world.launch import (
    DEFAULT_TIMEOUT_S,
    RankError,
    Ranks,
    RankStalled,
    WorldTimeout,
    held_context,
)
from partui.world.worker import worker_main

STALL_S = 8.0    # a heartbeat older than this names the rank (it stamps every 0.5 s)
QUIET_S = 2.0    # a heartbeat this old: the rank is frozen, not blocked (the flight check waits)


class WorldStopped(RankError):
    """Ranks blocked in comm ops and nothing issued anywhere for flight_gather.HANG_S: a hang.
    Its message carries the flight recorder's verdict."""


def setup_payload(plan, cfg, seed: int = 0, optim: str = "adamw", lr=None, backward: str = "hand",
                  weight_decay=None, link: dict | None = None, device: str | None = None,
                  validate_comms: bool = False, fault: tuple | None = None) -> dict:
    """What partui.world.rank's setup command builds an engine from (spawned or under torchrun);
    validate_comms: --validate-comms; fault: (kind, step, rank) of a --fault."""
    return {"plan": plan.to_dict(), "cfg": cfg.to_dict(), "seed": seed, "optim": optim, "lr": lr,
            "backward": backward, "weight_decay": weight_decay, "link": link, "device": device,
            "validate_comms": validate_comms, "fault": list(fault) if fault else None}


class Controller:
    """N held rank processes and a pipe to each. Use as a context manager or call close()."""

    def __init__(self, ranks: Ranks, timeout_s: float = DEFAULT_TIMEOUT_S, beats=None,
                 watch=None, flight_dir: str | None = None):
        self.ranks, self.size, self.timeout_s = ranks, ranks.size, timeout_s
        self.infos: list[dict] = []
        self.setup_payload: dict | None = None
        self.closed = False
        self.beats = beats       # one heartbeat stamp (time.monotonic) per rank, shared memory
        self.watch = watch       # what each rank's flight watcher publishes (partui/flight_gather)
        self.flight_dir = flight_dir   # where the ranks write their records when asked
        self.flight_path: str | None = None   # where a gathered dump goes (None: not written)
        self.flight_report: str | None = None  # the last verdict, as lines

    # ---------------------------------------------------------------- lifecycle
    @classmethod
    def launch(cls, size: int, timeout_s: float = DEFAULT_TIMEOUT_S, on_progress=None) -> "Controller":
        if size < 1:
            raise ValueError(f"world size {size} must be >= 1")
        ctx = held_context()
        say = on_progress or (lambda msg: None)
        beats = ctx.Array("d", size, lock=False)
        watch = ctx.Array("q", flight_gather.watch_size(size), lock=False)
        folder = tempfile.mkdtemp(prefix="partui-flight-")
        say(f"starting {size} rank processes")
        opts = {"timeout_s": timeout_s, "flight_dir": folder}
        try:
            ranks = Ranks(ctx, size, worker_main, (opts, beats, watch), size > 1)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        w = cls(ranks, timeout_s, beats, watch, folder)
        try:
            deadline = time.monotonic() + timeout_s
            port = w.ranks.relay_port(deadline, w._late("start"))
            if port is not None:
                say(f"rendezvous on 127.0.0.1:{port}")
            w.ranks.gather(range(size), deadline, w._late("start"), expect="ready")
            say(f"{size} ranks ready")
        except BaseException:
            w.close()
            raise
        return w

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self, grace_s: float = 3.0) -> None:
        """Ask every rank to exit, then terminate and kill what is left; never raises."""
        if not self.closed:
            self.closed = True
            self.ranks.close(grace_s, ask=("shutdown", None))
            if self.flight_dir:
                shutil.rmtree(self.flight_dir, ignore_errors=True)

    def pids(self) -> list[int]:
        return self.ranks.pids()

    # ---------------------------------------------------------------- messaging
    def _late(self, cmd: str):
        timeout_s = self.timeout_s
        return lambda ranks: WorldTimeout(f"ranks {ranks} did not answer {cmd!r} within "
                                          f"{timeout_s:.0f} s", ranks)

    def call(self, cmd: str, payload: dict | None = None, timeout_s: float | None = None) -> list:
        """Send a command to every rank and gather the replies in rank order. On any rank's
        error the world is closed (the others may be stuck in a collective) and RankError raised."""
        if self.closed:
            raise RuntimeError("the world is closed: launch a new one")
        timeout_s = timeout_s or self.timeout_s
        for r, c in enumerate(self.ranks.conns):
            try:
                c.send((cmd, payload))
            except OSError:
                self.close()
                raise RankError(r, f"process died with exit code {self.ranks.procs[r].exitcode}")
        try:
            replies = self.ranks.gather(range(self.size), time.monotonic() + timeout_s,
                                        self._late(cmd), idle=self._check_heartbeats)
        except BaseException as e:
            if isinstance(e, RankError) and not getattr(e, "diagnosed", False) and cmd == "step":
                self._diagnose(e, f"rank {e.rank} failed: {e.error.splitlines()[0][:200]}")
            self.close()
            raise
        return [replies[r] for r in range(self.size)]

    # ---------------------------------------------------------------- the flight recorder
    def flight(self, reason: str = "asked", frozen=()) -> dict | None:
        """Every rank's flight records, gathered now (their watchers answer even mid-hang), as
        one dump; written to flight_path when set. None without a watch (one-shot worlds).
        frozen: ranks not waited for (their shared rows are read instead)."""
        if self.watch is None or self.closed:
            return None
        dump = flight_gather.gather(self.watch, self.size, self.flight_dir,
                                    lambda r: self.ranks.procs[r].is_alive() and r not in frozen,
                                    reason)
        path = flight_gather.write(dump, self.flight_path) if self.flight_path else None
        self.flight_report = flight_gather.report(dump, path)
        return dump

    def _diagnose(self, e: RankError, reason: str, frozen=()) -> None:
        """Put the flight recorder's verdict into e's message (the world is about to close)."""
        try:
            self.flight(reason, frozen)
        except OSError as why:                         # a dump that cannot be written
            self.flight_report = f"flight dump not written: {why}"
        e.args = (f"{e.args[0]}\n{self.flight_report}",)
        e.diagnosed = True

    def _check_heartbeats(self) -> None:
        """RankStalled naming the first rank whose heartbeat is older than STALL_S; WorldStopped
        (with the flight recorder's verdict) when the ranks wait and nothing moves."""
        if self.beats is None:
            return
        now = time.monotonic()
        quiet = [r for r, stamp in enumerate(self.beats)
                 if stamp and now - stamp > QUIET_S and self.ranks.procs[r].is_alive()]
        for r in quiet:
            stamp, proc = self.beats[r], self.ranks.procs[r]
            if now - stamp > STALL_S:
                e = RankStalled(r, f"stopped making progress (pid {proc.pid}): no heartbeat for "
                                   f"{now - stamp:.0f} s (stopped, frozen or starved of CPU); the "
                                   f"world was closed")
                self._diagnose(e, f"rank {r}'s heartbeat silent for {now - stamp:.0f} s", quiet)
                raise e
        if self.watch is not None and not quiet:    # a frozen rank is the heartbeat's to name
            blocked = flight_gather.stopped(self.watch, self.size)
            if blocked is not None:
                e = WorldStopped(blocked, f"the world stopped making progress: rank {blocked} "
                                          f"blocked over {flight_gather.HANG_S:.0f} s with no op "
                                          f"issued anywhere; the world was closed")
                self._diagnose(e, f"stopped: rank {blocked} blocked, nothing issued for "
                                  f"{flight_gather.HANG_S:.0f} s")
                raise e

    # ---------------------------------------------------------------- verbs
    def setup(self, plan, cfg, **training) -> list[dict]:
        """Build every rank's engine (training: setup_payload's options); per rank its info."""
        self.setup_payload = setup_payload(plan, cfg, **training)
        self.infos = self.call("setup", self.setup_payload)
        return self.infos

    def step(self, n: int = 1, check: bool = False) -> list[list[dict]]:
        """Per rank, a list of n step summaries."""
        return self.call("step", {"n": n, "check": check})

    def snapshot(self, full: list[str] | None = None) -> list[dict]:
        return self.call("snapshot", {"full": full or []})

    def link(self, link: dict | None) -> dict | None:
        """Install an emulated link on every rank ({"text", "ranks_per_node"}; None: none)."""
        return self.call("link", link)[0]

    def inject_fault(self, rank: int, step: int) -> None:
        """Make `rank` raise when it reaches `step` (for testing failure handling)."""
        if self.closed:
            raise RuntimeError("the world is closed")
        self.ranks.conns[rank].send(("fault", {"step": step}))
        self.ranks.gather([rank], time.monotonic() + self.timeout_s, self._late("fault"))

    def trace_start(self, sparse: bool = True) -> None:
        self.call("trace_start", {"sparse": sparse})

    def trace_stop(self) -> list[dict]:
        return self.call("trace_stop", {})

