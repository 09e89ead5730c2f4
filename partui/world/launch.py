"""The one way to start a world of rank processes: start N ranks with a pipe to each, relay the
rendezvous port from rank 0 to the others, gather one message per rank under a deadline, and
leave no process behind. Two modes share it:

- held (partui.world.controller.Controller, behind partui.World: `partui run`, the app, the REPL, the
  benches that drive a World): ranks forked from a fork server that imported torch once, serving
  commands (partui.world.rank.serve) until closed;
- one-shot (`run_world`, for benches and tests): fn(rank, size, *args) on `size` forked gloo ranks,
  results in rank order, a deadline that names the ranks that gave no result, every rank killed on
  the way out. Forked, so fn and args need no pickling (closures work).

Under torchrun the world is torchrun's: partui.world.torchrun joins it and runs the same rank commands.
The rank side of the rendezvous is partui.world.rank.join. Light to import: torch loads in the ranks.
"""
from __future__ import annotations

import multiprocessing as mp
import sys
import time
from multiprocessing import forkserver
from multiprocessing.connection import wait as mp_wait

from partui.world.worker import one_shot_main

DEFAULT_TIMEOUT_S = 120.0
POLL_S = 1.0     # how often a waiting launcher wakes to look at the ranks (heartbeats)
MORE_TIME = "allow more time (timeout_s, or a bench's --timeout) or give it less work"
_held_ctx = None


class RankError(RuntimeError):
    """A rank raised or died. `.rank`, `.error`, `.traceback` say which and why; `world` (a
    one-shot world's name) puts the name and the rank's traceback into the message too."""

    def __init__(self, rank: int, error: str, tb: str = "", world: str = ""):
        head = f"{world}: rank {rank}" if world else f"rank {rank}"
        super().__init__(f"{head}: {error}" + (f"\n{tb}" if world and tb else ""))
        self.rank, self.error, self.traceback = rank, error, tb


class WorldTimeout(RuntimeError):
    """Ranks gave no answer by the deadline. `.ranks`: the ones that did not."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


class RankStalled(RankError):
    """A rank stopped making progress: its heartbeat went silent (stopped, frozen, starved)."""


def held_context():
    """A fork server that preloads torch and the engine: held ranks start warm."""
    global _held_ctx
    if _held_ctx is None:
        _held_ctx = mp.get_context("forkserver")
        _held_ctx.set_forkserver_preload(["torch", "kernels.engine", "partui.world.rank"])
    return _held_ctx


def warm_up() -> None:
    """Start the fork server now (it imports torch once), e.g. while a UI draws its first frame."""
    held_context()
    forkserver.ensure_running()


class Ranks:
    """`size` started rank processes, each running target(rank, size, conn, rendezvous, *args),
    and the launcher's end of each one's pipe."""

    def __init__(self, ctx, size: int, target, args: tuple, rendezvous: bool):
        if size < 1:
            raise ValueError(f"world size {size} must be >= 1")
        self.size, self.rendezvous = size, rendezvous
        self.procs: list = []
        self.conns: list = []
        try:
            for r in range(size):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=target, args=(r, size, child, rendezvous, *args),
                                daemon=True, name=f"partui-rank{r}")
                p.start()
                child.close()
                self.procs.append(p)
                self.conns.append(parent)
        except BaseException:
            self.close(0.0)
            raise

    def relay_port(self, deadline: float, late) -> int | None:
        """The launcher's half of the rendezvous: rank 0 serves the store on a port the OS
        picked (partui.world.rank.join) and says which; the others are told. None without one."""
        if not self.rendezvous:
            return None
        port = self.gather([0], deadline, late, expect="port")[0]
        for c in self.conns[1:]:
            c.send(("port", port))
        return port

    def gather(self, pending, deadline: float, late, expect: str = "ok", idle=None,
               world: str = "") -> dict:
        """One `expect` message from each pending rank, whichever answers first (so a failing
        rank is named at once, not after its peers time out waiting for it): {rank: body}.
        late(ranks) makes the error raised at the deadline; idle() runs while nothing comes."""
        pending, out = set(pending), {}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise late(sorted(pending))
            waitables = {self.conns[r]: r for r in pending}
            waitables.update({self.procs[r].sentinel: r for r in pending})
            ready = mp_wait(list(waitables), timeout=min(left, POLL_S))
            if not ready and idle is not None:
                idle()
            for obj in ready:
                r = waitables[obj]
                if r not in pending:
                    continue
                msg = self._poll(r)
                if msg is None:
                    if obj is self.procs[r].sentinel:   # the sentinel can close before exit
                        self.procs[r].join(0.5)
                        raise RankError(r, f"process died with exit code "
                                           f"{self.procs[r].exitcode}", world=world)
                    continue
                kind, body = msg
                if kind == "error":
                    raise RankError(body["rank"], body["error"], body.get("traceback", ""), world)
                if kind != expect:
                    raise RankError(r, f"sent {kind!r} where {expect!r} was due", world=world)
                out[r] = body
                pending.discard(r)
        return out

    def _poll(self, r: int):
        """A waiting message from rank r, None if there is none; RankError if its pipe broke."""
        try:
            if not self.conns[r].poll(0):
                return None
            return self.conns[r].recv()
        except (EOFError, OSError):
            self.procs[r].join(0.5)
            raise RankError(r, f"process died with exit code {self.procs[r].exitcode}")

    def close(self, grace_s: float, ask=None) -> None:
        """Send `ask` (a goodbye message) if given, wait grace_s for the ranks to exit, then
        terminate and kill what is left; never raises."""
        if ask is not None:
            for c in self.conns:
                try:
                    c.send(ask)
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


def run_world(size: int, fn, *args, timeout_s: float = DEFAULT_TIMEOUT_S, what: str = "world",
              fix: str = MORE_TIME) -> list:
    """One-shot: fn(rank, size, *args) on `size` forked gloo ranks (one torch thread each); their
    results in rank order. A rank's exception is a RankError carrying its traceback; a rank that
    dies raises RankError, a world past timeout_s WorldTimeout naming the ranks that gave no
    result. Every rank process is gone when it returns. `what` names the world in errors ("cp 4
    world"); `fix` is what a timeout suggests."""
    if size < 1:
        raise ValueError(f"run_world: size {size}: a world needs 1 rank or more")
    held = sys.modules.get("kernels.comm")     # a gloo world is only ever held through it
    if held is not None and held.is_initialized():
        raise RuntimeError(f"run_world ({what}): this process already holds a gloo world, which "
                           f"forked ranks would inherit: call comm.destroy() first")

    def late(ranks):
        return WorldTimeout(f"the {what} did not finish within {timeout_s:g} s (rank(s) {ranks} "
                            f"gave no result; every rank was killed): {fix}", ranks)

    deadline = time.monotonic() + timeout_s
    ranks = Ranks(mp.get_context("fork"), size, one_shot_main, (fn, args, timeout_s), True)
    finished = False
    try:
        ranks.relay_port(deadline, late)
        results = ranks.gather(range(size), deadline, late, world=what)
        finished = True
        return [results[r] for r in range(size)]
    finally:
        ranks.close(2.0 if finished else 0.0)          # after a failure the rest only hang
