"""`World`: the one controller of a live gloo world (its ranks started by partui.world.launch).
`partui run`, the app, the REPL, scripts and notebooks all drive it.

    from partui import World
    w = World(check=True)          # training options: seed, optim, lr, weight_decay, backward, check
    w.plan("zero2", dp=2)          # validated Plan (partui.world.plans.build_plan); nothing started yet
    w.launch()                     # rank processes + engines (+ the reference, with check)
    w.step(2); w.show(1, "optim")  # step lines, one rank's optimizer state: Rows (partui.world.tables),
                                   # printed as tables, .to_pandas() for DataFrames
    w.trace_on(); w.step(); path = w.trace_save("demo"); w.report()
    w.summary(); w.close()         # the summary covers every step; w.history holds the last
                                   # HISTORY_LINES lines, w.losses() the last LOSSES_KEPT,
                                   # w.steps_done counts them all
    World(link="h800", ranks_per_node=2)   # an emulated interconnect (planning.link); or
    w.set_link("alpha_us=50,gbps=0.5")     # between steps; w.set_link(None) removes it
    w.slow(rank=1, factor=1.5)             # between steps: rank 1's compute 1.5x as long (or
                                           # stage=S); w.slow() clears it (kernels.straggle)

Every method is safe to call from a worker thread: one lock serialises talk to the ranks.
A rank failure closes the world (its peers may be stuck in a collective) and raises RankError;
`reset()` (or `launch()`) brings the same plan back. Light to import: torch loads with the first
plan, pandas with the first report.
"""
from __future__ import annotations

import os
import threading
import time
from collections import deque

from partui.checkpoints.checkpoint import check_resume, save_world
from partui.world.controller import Controller
from partui.world.launch import RankError, WorldTimeout
from partui.world.plans import MODEL_FIELDS, build_plan, check_backward, check_reference
from partui.world.results import StepTotals, step_line, summarize
from partui.world.show_kinds import TABLES, show_kind
from partui.world.tables import Rows, show_rows, step_rows
from partui.world.world_trace import TraceWindows
from planning.fault_spec import parse_fault
from planning.link import LinkModel, check_link
from planning.mesh import Plan
from planning.slow_spec import WHO, check_straggler

# step lines a World keeps (older ones live on only in its StepTotals): the app's routing tab
# shows the last 40; few enough that a soak measured from step 100 starts with the history full
HISTORY_LINES = 64
LOSSES_KEPT = 200   # losses a World keeps, past its history lines: the app's loss sparkline


def past(line: dict) -> dict:
    """A step line once a newer one is shown: every rank's row and ledger go (~8.5 KB of a world-4
    line), what the summary aggregates stays (loss, step time, check errors, load figures)."""
    return {k: v for k, v in line.items() if k not in ("ledgers", "ranks")}


class World(TraceWindows):
    def __init__(self, timeout_s: float = 120.0, seed: int = 0, optim: str = "adamw",
                 lr: float | None = None, backward: str = "hand", weight_decay: float | None = None,
                 check: bool = False, reference: str = "hand", link: str | None = None,
                 ranks_per_node: int | None = None, history_lines: int = HISTORY_LINES,
                 validate_comms: bool = False, fault: str = "", flight_dump: str | None = None):
        if history_lines < 1:
            raise ValueError(f"history_lines={history_lines}: a World keeps at least its newest "
                             f"step line; use history_lines >= 1 (default {HISTORY_LINES})")
        self.timeout_s, self.seed, self.optim, self.lr = timeout_s, seed, optim, lr
        self.reference = reference                 # what check=True holds the plan to
        check_link(link, ranks_per_node, ranks_per_node or 1)
        self.link_spec = {"text": link, "ranks_per_node": ranks_per_node} if link else None
        self.link: dict | None = None      # the installed LinkModel (as a dict), from rank 0
        self.backward, self.weight_decay, self.check = backward, weight_decay, check
        # --validate-comms (on with check), --fault KIND@STEP:RANK, where a flight dump goes
        self.validate_comms, self.fault, self.flight_dump = validate_comms or check, fault, flight_dump
        self.preset: str | None = None
        self.current_plan = self.cfg = self.controller = self.checker = None
        self.infos: list[dict] = []
        self.history_lines = history_lines
        self.history: list[dict] = []      # the last history_lines step lines (the newest in full)
        self.totals = StepTotals()         # every step since launch, folded: count, summary figures
        self.recent_losses: deque[float] = deque(maxlen=LOSSES_KEPT)
        self._traced_routing: dict[int, dict] = {}   # recorded steps' moe_layers, for trace_save
        self.launch_s = 0.0
        self.recording = False
        self._traced: list[list[dict]] = []  # one list per recorded window, one entry per rank
        self._traced_steps: list[int] = []
        self._window_from = 0                # where the open window's steps start in _traced_steps
        self.trace_path: str | None = None
        self.trace_meta: dict = {}           # the saved trace's plan, steps and time (trace_about)
        self.model = "tiny"
        # World.slow's live straggler {"rank"|"stage", "factor"}; {} cleared; None: the Plan's
        self.slowed: dict | None = None
        self._lock = threading.RLock()

    # ---------------------------------------------------------------- plan and lifecycle
    def plan(self, preset: str = "custom", model: str = "tiny", **fields) -> Plan:
        """Validate and remember a plan (closing a running world); `launch()` starts it. Fields are
        Plan fields and model overrides (layers, dim, heads, kv_heads, seq, batch, vocab)."""
        model_kw = {k: fields.pop(k) for k in MODEL_FIELDS if k in fields}
        plan, cfg = build_plan(preset, model, model_kw, **fields)
        check_backward(plan, self.backward)
        parse_fault(self.fault, plan.world)
        if self.link_spec:
            check_link(self.link_spec["text"], self.link_spec["ranks_per_node"], plan.world)
        if self.check:
            check_reference(plan, cfg, self.reference)
        with self._lock:
            self.close()
            self.preset, self.current_plan, self.cfg, self.model = preset, plan, cfg, model
        return plan

    @property
    def launched(self) -> bool:
        return self.controller is not None and not self.controller.closed

    @property
    def failed(self) -> bool:
        """Whether a checked step since launch failed against the reference."""
        return self.totals.failed

    @property
    def steps_done(self) -> int:
        """Steps since launch: the next step's number (history keeps only the last lines)."""
        return self.totals.steps

    def launch(self, on_progress=None) -> list[dict]:
        """Start the ranks and build every engine; per rank its info (label, role, ledger)."""
        if self.current_plan is None:
            raise RuntimeError("no plan yet: call plan('dp', dp=2) (or `plan dp dp=2`) first")
        with self._lock:
            self.close()
            say = on_progress or (lambda msg: None)
            t0 = time.perf_counter()
            ctl = Controller.launch(self.current_plan.world, self.timeout_s, on_progress)
            ctl.flight_path = self.flight_dump
            self.launch_s = time.perf_counter() - t0
            say("building engines")
            try:
                self.infos = ctl.setup(self.current_plan, self.cfg, link=self.link_spec,
                                       **self.training())
                self.link = self.infos[0].get("link")
                self.checker = self._checker() if self.check else None
            except BaseException:
                ctl.close()
                raise
            self.controller, self.history, self.slowed = ctl, [], None   # fresh engines: the Plan's
            self.totals, self.recent_losses = StepTotals(), deque(maxlen=LOSSES_KEPT)
            say(f"{self.current_plan.world} ranks ready")
            return self.infos

    def training(self) -> dict:
        """The training options every rank's engine is built with (partui.world.controller.setup_payload)."""
        return {"seed": self.seed, "optim": self.optim, "lr": self.lr, "backward": self.backward,
                "weight_decay": self.weight_decay, "validate_comms": self.validate_comms,
                "fault": parse_fault(self.fault, self.current_plan.world)}

    def doctor(self, reason: str = "asked") -> str:
        """The flight recorder's verdict now: every rank's last ops gathered (written to
        flight_dump when set); the lines `partui doctor` prints."""
        if not self.launched:
            raise RuntimeError("no world running: launch() first (or partui doctor DUMP)")
        self.last_flight = self.controller.flight(reason)   # the dump: each rank's last ops
        return self.controller.flight_report

    def _checker(self):
        # lazy: the single-process reference imports torch; only a checked world needs it
        from partui.world.checker import Checker
        return Checker(self.current_plan, self.cfg, self.seed, self.optim, self.lr,
                       self.weight_decay, self.reference)

    def set_link(self, link: str | None, ranks_per_node: int | None = None) -> dict | None:
        """Switch the emulated link (a preset, `alpha_us=A,gbps=B`, or None for none) between
        steps; a preset is calibrated again. Returns the installed model as a dict."""
        world = self.current_plan.world if self.current_plan else (ranks_per_node or 1)
        check_link(link, ranks_per_node, world)
        with self._lock:
            self.link_spec = {"text": link, "ranks_per_node": ranks_per_node} if link else None
            self.link = self._guard(lambda c: c.link(self.link_spec)) if self.launched else None
            return self.link

    def link_text(self) -> str:
        """The installed link in words ("no emulated link" without one)."""
        return LinkModel.from_dict(self.link).describe() if self.link else "no emulated link"

    def slow(self, rank: int | None = None, factor: float | None = None,
             stage: int | None = None) -> list[float]:
        """A straggler between steps: from the next step rank `rank` (or every rank of pipeline
        stage `stage`) runs its compute `factor` times as long; slow() clears it. It replaces the
        Plan's --slow-rank / --slow-stage on the running engines until the next launch (the Plan
        is frozen: each rank's runner holds the live factor). Returns each rank's factor."""
        if not self.launched:
            raise RuntimeError("slow acts on a running world: launch first (or plan with "
                               "slow_rank=R=F to start one slowed)")
        plan = self.current_plan
        who = {k: v for k, v in (("rank", rank), ("stage", stage)) if v is not None}
        if len(who) > 1:
            raise ValueError("slow one rank or one stage at a time: slow(rank=1, factor=1.5) "
                             "or slow(stage=0, factor=2)")
        if who and factor is None:
            raise ValueError(f"slow({next(iter(who))}=...) needs factor=F, e.g. factor=1.5")
        if factor is not None and not who:
            raise ValueError("a factor needs rank=R or stage=S: slow(rank=1, factor=1.5); "
                             "slow() clears the straggler")
        for field, top in (("slow_rank", plan.world), ("slow_stage", plan.pp)):
            key = WHO[field][0]
            if key in who:
                check_straggler(field, who[key], factor, f"slow({key}={who[key]}, factor={factor:g})", top)
        payload = {k: [v, float(factor)] for k, v in who.items()}
        with self._lock:
            factors = self._guard(lambda c: c.call("slow", payload))
            self.slowed = {**who, "factor": float(factor)} if who else {}
            return factors

    def slow_text(self) -> str:
        """The live straggler in words ("no straggler set" without one)."""
        plan = self.current_plan
        if self.slowed is None:          # none set since launch: the Plan's fields hold
            planned = [f"{f} {v}" for f, v in (("slow_rank", plan and plan.slow_rank),
                                               ("slow_stage", plan and plan.slow_stage)) if v]
            return "straggler as planned: " + ", ".join(planned) if planned else "no straggler"
        if not self.slowed:
            return "no straggler (cleared with slow off)"
        who = next(f"{k} {v}" for k, v in self.slowed.items() if k != "factor")
        return f"{who}'s compute runs {self.slowed['factor']:g}x as long from the next step"

    def reset(self, on_progress=None) -> list[dict]:
        """The same plan from step 0 (a fresh world)."""
        return self.launch(on_progress)

    def close(self, wait_s: float = 30.0, grace_s: float = 3.0) -> None:
        """Tear the ranks down (waiting up to wait_s for a step in flight, then grace_s for each
        rank to exit when asked before it is killed); never raises."""
        got = self._lock.acquire(timeout=wait_s)
        try:
            if self.controller is not None:
                self.controller.close(grace_s)
            self.controller, self.recording = None, False
            self._traced, self._traced_steps, self._traced_routing = [], [], {}
        finally:
            if got:
                self._lock.release()

    def pids(self) -> list[int]:
        return self.controller.pids() if self.controller is not None else []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        if self.current_plan is None:
            return "World(no plan: w.plan('dp', dp=2))"
        state = f"step {self.steps_done}" if self.launched else "not launched"
        return f"World({self.current_plan.describe()} · world {self.current_plan.world} · {state})"

    # ---------------------------------------------------------------- training
    def _ctl(self):
        if not self.launched:
            if self.current_plan is None:
                raise RuntimeError("no world: plan('dp', dp=2) then launch()")
            self.launch()
        return self.controller

    def _guard(self, fn):
        """Run fn(controller); a failed world is dropped so the next call can relaunch."""
        try:
            return fn(self._ctl())
        except (RankError, WorldTimeout):
            self.controller, self.recording = None, False
            raise

    def step(self, n: int = 1) -> Rows:
        """n steps; one step line per step (partui.world.results), checked against the reference when
        the world was made with check=True. Prints as a table; `.to_pandas()` is a DataFrame."""
        if n < 1:
            raise ValueError(f"step {n}: the number of steps must be >= 1")
        with self._lock:
            first = self.steps_done
            per_rank = self._guard(lambda c: c.step(n, check=self.check))
            lines = []
            for i in range(n):
                items = [r[i] for r in per_rank]
                line = step_line(items)
                if self.checker is not None:
                    self.checker.step(items, line)
                lines.append(line)
            if self.history and "ledgers" in self.history[-1]:
                self.history[-1] = past(self.history[-1])
            self.history += [past(ln) for ln in lines[:-1]] + lines[-1:]
            del self.history[:-self.history_lines]   # bounded: older lines live on in totals
            for line in lines:
                self.totals.add(line)
                self.recent_losses.append(line["loss"])
            if self.recording:
                self._traced_steps += range(first, first + n)
                self._traced_routing.update((ln["step"], ln["moe_layers"]) for ln in lines
                                            if "moe_layers" in ln)
            return step_rows(lines)

    def run(self, n: int, on_step=None, should_stop=None, trace_steps=None,
            sparse: bool = True) -> list[dict]:
        """n single steps, calling on_step(line) after each; stops early when should_stop().
        trace_steps (step numbers since launch): record those steps, one window per run of them."""
        out = []
        for _ in range(n):
            if should_stop is not None and should_stop():
                break
            at = self.steps_done
            if trace_steps and at in trace_steps:
                self.trace_on(sparse)
            line = self.step(1)[0]
            if trace_steps and self.recording and at + 1 not in trace_steps:
                self.trace_off()
            out.append(line)
            if on_step is not None:
                on_step(line)
        return step_rows(out)

    def losses(self) -> list[float]:
        """The losses of the last LOSSES_KEPT steps (every step's when fewer)."""
        return list(self.recent_losses)

    def summary(self) -> dict:
        """The run so far (partui.world.results.summarize): what `partui run` prints last."""
        if self.current_plan is None:
            raise RuntimeError("no plan yet: nothing to summarise")
        out = summarize(self.current_plan, self.cfg, self.infos, self.history, self.launch_s,
                        checked=self.check, trace_path=self.trace_path, totals=self.totals)
        if self.link:
            out["link"] = dict(self.link, describe=self.link_text())
        return out

    # ---------------------------------------------------------------- checkpoints
    def save(self, folder: str, keep: int | None = None, kill_rank: int | None = None,
             fault: str | None = None) -> str:
        """Checkpoint the live world between steps: every rank writes its own shards (DCP) into
        folder/step-NNNNNNNN, committed once all have written; the oldest beyond `keep` go.
        Returns the checkpoint's folder (partui.checkpoints.checkpoint). kill_rank / fault: the tests' and
        labs' injected failures (a rank SIGKILLed after writing; kernels/checkpoint/faults.py)."""
        with self._lock:
            return self._guard(lambda c: save_world(c, folder, self.current_plan, self.cfg,
                                                    self.model, self.training(), keep, kill_rank,
                                                    fault))

    def load(self, path: str, fault: str | None = None) -> int:
        """Resume the live world (launched if not) from a checkpoint folder or save root, whatever
        plan wrote it; the next step carries on from its step. A checkpoint this plan cannot
        take raises CheckpointError (a ValueError) before any rank reads it."""
        with self._lock:
            ckpt, _ = check_resume(path, self.current_plan, self.cfg, self.training())
            steps = self._guard(lambda c: c.call("load", {"path": os.path.abspath(ckpt),
                                                          "fault": fault}))
            if self.checker is not None:
                self.checker.load(ckpt)
            return steps[0]

    # ---------------------------------------------------------------- inspection
    def snapshot(self, full: list[str] | None = None) -> list[dict]:
        with self._lock:
            return self._guard(lambda c: c.snapshot(full))

    def show(self, rank: int, what: str = "params", name: str | None = None) -> Rows:
        """Rows of one rank's params, grads or optimizer state; `name` filters (substring). Prints
        as a table; `.to_pandas()` is a DataFrame."""
        what = show_kind(what)
        if what not in TABLES:
            raise ValueError(f"show {what!r}: pick one of {', '.join(TABLES)}")
        world = self.current_plan.world if self.current_plan else 0
        if not 0 <= rank < max(world, 1):
            raise ValueError(f"rank {rank} is outside the world of {world}: pick 0..{world - 1}")
        snap = self.snapshot()[rank]
        if what == "optim":
            rows = snap["optimizer"]
        else:                         # a param's row carries its grad's figures too
            rows = snap["params"] + (snap["state"] if what == "params" else [])
        if name:
            rows = [r for r in rows if name in r["name"]]
            if not rows:
                raise ValueError(f"rank {rank} holds no parameter matching {name!r}")
        return show_rows(rows, what, f"rank {rank} {what}")
