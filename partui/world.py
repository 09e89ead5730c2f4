"""Launch and tear down a gloo world of rank processes, and the controller that talks to them.

Ranks are forked from a fork server that has imported torch once, so a 4-rank world is ready
in about the time of one torch import. Every wait is bounded; a rank that raises or dies
surfaces as RankError with its rank and traceback; close() leaves no process behind.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing import forkserver
from multiprocessing.connection import wait as mp_wait

from partui.worker import worker_main

DEFAULT_TIMEOUT_S = 120.0
_ctx = None


class RankError(RuntimeError):
    """A rank raised or died. `.rank`, `.error`, `.traceback` say which and why."""

    def __init__(self, rank: int, error: str, tb: str = ""):
        super().__init__(f"rank {rank}: {error}")
        self.rank, self.error, self.traceback = rank, error, tb


class WorldTimeout(RuntimeError):
    pass


class RankStalled(RankError):
    """A rank stopped making progress: its heartbeat went silent (stopped, frozen, starved)."""


STALL_S = 8.0    # a heartbeat older than this names the rank (it stamps every 0.5 s)
POLL_S = 1.0     # how often a waiting controller looks at the heartbeats


def _mp_context():
    """A fork server that preloads torch and the engine: children start warm."""
    global _ctx
    if _ctx is None:
        _ctx = mp.get_context("forkserver")
        _ctx.set_forkserver_preload(["torch", "kernels.engine", "partui.rank"])
    return _ctx


def warm_up() -> None:
    """Start the fork server now (it imports torch once), e.g. while a UI draws its first frame."""
    _mp_context()
    forkserver.ensure_running()


class Controller:
    """N rank processes and a pipe to each. Use as a context manager or call close()."""

    def __init__(self, size: int, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.size, self.timeout_s = size, timeout_s
        self.procs: list = []
        self.conns: list = []
        self.infos: list[dict] = []
        self.setup_payload: dict | None = None
        self.closed = False
        self.beats = None        # one heartbeat stamp (time.monotonic) per rank, shared memory

    # ---------------------------------------------------------------- lifecycle
    @classmethod
    def launch(cls, size: int, timeout_s: float = DEFAULT_TIMEOUT_S, on_progress=None) -> "Controller":
        if size < 1:
            raise ValueError(f"world size {size} must be >= 1")
        w = cls(size, timeout_s)
        ctx = _mp_context()
        say = on_progress or (lambda msg: None)
        w.beats = ctx.Array("d", size, lock=False)
        try:
            say(f"starting {size} rank processes")
            for r in range(size):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=worker_main, daemon=True, name=f"partui-rank{r}",
                                args=(r, size, child, {"timeout_s": timeout_s}, w.beats))
                p.start()
                child.close()
                w.procs.append(p)
                w.conns.append(parent)
            if size > 1:
                kind, port = w._recv(0, timeout_s)
                if kind != "port":
                    raise RankError(0, f"unexpected first message {kind!r}")
                for r in range(1, size):
                    w.conns[r].send(("port", port))
                say(f"rendezvous on 127.0.0.1:{port}")
            for r in range(size):
                kind, _ = w._recv(r, timeout_s)
                if kind == "error":
                    raise RankError(r, str(_))
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
        if self.closed:
            return
        self.closed = True
        for c in self.conns:
            try:
                c.send(("shutdown", None))
            except (OSError, BrokenPipeError, EOFError):
                pass
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(1.0)
            if p.is_alive():
                p.kill()
                p.join(1.0)
        for c in self.conns:
            c.close()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    # ---------------------------------------------------------------- messaging
    def _recv(self, r: int, timeout_s: float):
        """One message from rank r, or RankError if it died, WorldTimeout if it is silent."""
        conn, proc = self.conns[r], self.procs[r]
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorldTimeout(f"rank {r} did not answer within {timeout_s:.0f} s")
            ready = mp_wait([conn, proc.sentinel], timeout=left)
            if conn in ready:
                try:
                    return conn.recv()
                except EOFError:
                    raise RankError(r, f"rank {r} closed its pipe (exit code {proc.exitcode})")
            if proc.sentinel in ready:
                if conn.poll(0):
                    continue
                proc.join(0.5)
                raise RankError(r, f"process died with exit code {proc.exitcode}")

    def call(self, cmd: str, payload: dict | None = None, timeout_s: float | None = None) -> list:
        """Send a command to every rank and gather the replies in rank order. On any rank's
        error the world is closed (the others may be stuck in a collective) and RankError raised."""
        if self.closed:
            raise RuntimeError("the world is closed: launch a new one")
        timeout_s = timeout_s or self.timeout_s
        for r, c in enumerate(self.conns):
            try:
                c.send((cmd, payload))
            except OSError:
                self.close()
                raise RankError(r, f"process died with exit code {self.procs[r].exitcode}")
        replies: list = [None] * self.size
        pending = set(range(self.size))
        deadline = time.monotonic() + timeout_s
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorldTimeout(f"ranks {sorted(pending)} did not answer {cmd!r} within "
                                       f"{timeout_s:.0f} s")
                waitables = {self.conns[r]: r for r in pending}
                waitables.update({self.procs[r].sentinel: r for r in pending})
                ready = mp_wait(list(waitables), timeout=min(left, POLL_S))
                if not ready:
                    self._check_heartbeats()
                for obj in ready:
                    r = waitables[obj]
                    if r not in pending:
                        continue
                    msg = self._poll(r)
                    if msg is None:
                        if obj is self.procs[r].sentinel:
                            self.procs[r].join(0.5)
                            raise RankError(r, f"process died with exit code "
                                               f"{self.procs[r].exitcode}")
                        continue
                    kind, body = msg
                    if kind == "error":
                        raise RankError(body["rank"], body["error"], body.get("traceback", ""))
                    replies[r] = body
                    pending.discard(r)
        except BaseException:
            self.close()
            raise
        return replies

    def _check_heartbeats(self) -> None:
        """RankStalled naming the first rank whose heartbeat is older than STALL_S."""
        if self.beats is None:
            return
        now = time.monotonic()
        for r, stamp in enumerate(self.beats):
            if stamp and now - stamp > STALL_S and self.procs[r].is_alive():
                raise RankStalled(r, f"stopped making progress (pid {self.procs[r].pid}): "
                                     f"no heartbeat for {now - stamp:.0f} s (stopped, frozen or "
                                     f"starved of CPU); the world was closed")

    def _poll(self, r: int):
        """A waiting message from rank r, None if there is none; RankError if its pipe broke."""
        try:
            if not self.conns[r].poll(0):
                return None
            return self.conns[r].recv()
        except (EOFError, OSError):
            self.procs[r].join(0.5)
            raise RankError(r, f"process died with exit code {self.procs[r].exitcode}")

    # ---------------------------------------------------------------- verbs
    def setup(self, plan, cfg, seed: int = 0, optim: str = "adamw", lr=None,
              backward: str = "hand", weight_decay=None, link: dict | None = None) -> list[dict]:
        self.setup_payload = {"plan": plan.to_dict(), "cfg": cfg.to_dict(), "seed": seed,
                              "optim": optim, "lr": lr, "backward": backward,
                              "weight_decay": weight_decay, "link": link}
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
        self.conns[rank].send(("fault", {"step": step}))
        kind, body = self._recv(rank, self.timeout_s)
        if kind == "error":
            raise RankError(rank, body["error"], body.get("traceback", ""))

    def trace_start(self, sparse: bool = True) -> None:
        self.call("trace_start", {"sparse": sparse})

    def trace_stop(self) -> list[dict]:
        return self.call("trace_stop", {})

