"""The rank side, written once: joining the world (the rendezvous), the commands setup(plan),
step(n), snapshot(query), link, slow, trace(on/off), and the loops that run them.

Runs only in a rank process: partui.world.worker's entry points import it there (the fork server
preloads it), and partui.world.torchrun runs the same commands on each of torchrun's ranks. Every command
gets one reply: ("ok", payload) or ("error", {rank, error, traceback}), so an exception in any rank
reaches the controller with its rank and traceback.
"""
from __future__ import annotations

import gc
import os
import signal
import traceback

import torch

from kernels import comm
from kernels.checkpoint import load_engine, save_engine
from kernels.calibrate import install_link
from kernels.comm import faults, flight
from kernels.engine import Engine
from partui.diagnosis import flight_watch
from partui.world import snapshot
from partui.recording.profile import RankProfile
from partui.recording.trace import RankTracer
from planning.config import ModelConfig
from planning.mesh import Plan
from planning.slow_spec import factor_of


class InjectedFault(RuntimeError):
    """Raised on purpose (Controller.inject_fault) to test failure handling end to end."""


def freeze_inherited_heap() -> None:
    """Move every object the rank was forked with (torch and partui's modules: ~170k) out of the
    cyclic GC's reach; they live as long as the rank. Unfrozen, the rank's first full collection
    walked them all (110-440 ms measured, as each walk copies the shared pages it touches): set off
    by a traced step's recorder tuples and events, it stalled whatever layer it fell in, or the gap
    between two steps (issue 33). A later full collection walks only what the rank made. O(1)."""
    gc.freeze()


def join(rank: int, size: int, conn, timeout_s: float, backend: str = "gloo") -> None:
    """The rank's half of the rendezvous (partui.world.launch.Ranks.relay_port is the other): rank 0
    serves the store on a loopback port the OS picks and tells the launcher, which tells the
    rest."""
    if rank == 0:
        store, port = comm.store_server(size, timeout_s)
        conn.send(("port", port))
    else:
        kind, port = conn.recv()
        if kind != "port":
            raise RuntimeError(f"rank {rank} got {kind!r} from the launcher where the port was due")
        store = comm.store_client(port, size, timeout_s)
    comm.init(backend, rank, size, store=store, timeout_s=timeout_s)


def error_reply(rank: int, e: BaseException) -> tuple:
    """The one form of a rank's failure; the launcher raises it as RankError."""
    return ("error", {"rank": rank, "error": f"{type(e).__name__}: {e}",
                      "traceback": traceback.format_exc()})


def new_state(rank: int) -> dict:
    return {"engine": None, "tracer": None, "profile": None, "fault_step": None, "rank": rank}


def serve(rank: int, world: int, conn, rendezvous: bool, opts: dict, watch=None) -> None:
    """A held rank: join, then answer the controller's commands until shutdown."""
    torch.set_num_threads(1)  # two intra-op threads per rank made a 4-rank step 20x slower here
    freeze_inherited_heap()
    if watch is not None and opts.get("flight_dir"):
        flight_watch.start(rank, world, watch, opts["flight_dir"])
    try:
        if rendezvous:
            join(rank, world, conn, opts.get("timeout_s", 60.0), opts.get("backend", "gloo"))
    except (EOFError, BrokenPipeError):
        raise                                          # the controller went away
    except BaseException as e:  # noqa: BLE001 - a failure before the loop: report and exit
        conn.send(error_reply(rank, e))
        return
    conn.send(("ready", rank))
    state = new_state(rank)
    while True:
        cmd, payload = conn.recv()
        if cmd == "shutdown":
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", handle(state, cmd, payload or {})))
        except BaseException as e:  # noqa: BLE001 - every failure goes to the controller
            conn.send(error_reply(rank, e))
    comm.destroy()


def run_once(rank: int, size: int, conn, rendezvous: bool, fn, args: tuple,
             timeout_s: float) -> None:
    """A one-shot rank: join, fn(rank, size, *args), its result to the launcher at once (so a
    deadline names only the ranks still working), then wait for the rest: rank 0's store lives
    until every rank is done."""
    torch.set_num_threads(1)                           # ranks share the machine's few cores
    freeze_inherited_heap()
    try:
        if rendezvous:
            join(rank, size, conn, timeout_s)
        conn.send(("ok", fn(rank, size, *args)))
        comm.barrier()
        comm.destroy()
    except BaseException as e:  # noqa: BLE001 - every failure goes to the launcher
        conn.send(error_reply(rank, e))


def _link(eng, spec: dict | None) -> dict | None:
    """Install the emulated link spec names ({"text", "ranks_per_node"}; None: none)."""
    spec = spec or {}
    link = install_link(spec.get("text"), spec.get("ranks_per_node"), eng.cfg, eng.plan.world)
    return link.to_dict() if link is not None else None


def handle(state: dict, cmd: str, payload: dict):
    if cmd == "setup":
        comm.set_validate(bool(payload.get("validate_comms")))   # before the engine makes groups
        faults.arm(*(payload.get("fault") or (None,)))
        flight.recorder.clear()
        eng = Engine(Plan.from_dict(payload["plan"]), ModelConfig(**payload["cfg"]),
                     rank=state["rank"], seed=payload.get("seed", 0),
                     optim=payload.get("optim", "adamw"), lr=payload.get("lr"),
                     backward=payload.get("backward", "hand"),
                     weight_decay=payload.get("weight_decay"),
                     device=payload.get("device") or "cpu")
        state["engine"] = eng
        info = snapshot.rank_info(eng)
        info["link"] = _link(eng, payload.get("link"))
        return info
    eng = state["engine"]
    if eng is None:
        raise RuntimeError(f"command {cmd!r} before setup: launch a plan first")
    if cmd == "step":
        out = []
        for _ in range(payload.get("n", 1)):
            if state["fault_step"] is not None and eng.step_count == state["fault_step"]:
                state["fault_step"] = None
                raise InjectedFault(f"injected fault at step {eng.step_count}")
            flight.recorder.step = eng.step_count
            out.append(snapshot.step_item(eng, check=payload.get("check", False)))
        return out
    if cmd == "link":                 # between steps: every rank at once (it is collective)
        return _link(eng, payload)
    if cmd == "slow":                 # between steps: the runner's live factor (the Plan is frozen)
        eng.runner.slow = factor_of(state["rank"], eng.ctx.coords["pp"], payload.get("rank"),
                                    payload.get("stage"))      # each (who, factor) or None
        return eng.runner.slow
    if cmd == "snapshot":
        return snapshot.take(eng, payload)
    if cmd == "save":                 # every rank at once into the folder the controller made
        save_engine(eng, payload["path"], payload.get("fault"))
        if payload.get("kill_rank") == state["rank"]:   # a test's SIGKILL before the commit
            os.kill(os.getpid(), signal.SIGKILL)
        return eng.step_count
    if cmd == "load":                 # every rank at once, after setup: DCP reshards
        load_engine(eng, payload["path"], payload.get("fault"))
        return eng.step_count
    if cmd == "flight":               # the recorder on / off (partui bench flight): ops seen so far
        flight.recorder.enabled = bool(payload.get("on", True))
        return sum(flight.recorder.seqs.values())
    if cmd == "fault":
        state["fault_step"] = payload["step"]
        return None
    if cmd == "trace_start":
        state["tracer"] = RankTracer(state["rank"], eng.ctx.label,
                                     sparse=payload.get("sparse", True)).start()
        return None
    if cmd == "profile_start":        # --profile: torch.profiler until profile_stop
        state["profile"] = RankProfile(payload["dir"], state["rank"], eng.plan.world).start()
        return None
    if cmd in ("trace_stop", "profile_stop"):
        what = cmd.removesuffix("_stop")
        key = "tracer" if what == "trace" else what
        recorder, state[key] = state[key], None
        if recorder is None:
            raise RuntimeError(f"{what} stop without {what} start")
        return recorder.stop()
    raise ValueError(f"unknown command {cmd!r}")
