"""`World`: the high-level Python API over a live gloo world, for scripts, notebooks, the REPL
and the TUI (which is one client of it).

    from partui import World
    w = World()
    w.plan("zero2", dp=2)          # validated Plan; nothing started yet
    w.launch()                     # rank processes + engines
    w.step(2); w.show(1, "optim")  # per-step lines; one rank's optimizer state rows
    w.trace_on(); w.step(); path = w.trace_save("demo"); w.report()
    w.close()

Every method is safe to call from a worker thread: one lock serialises talk to the ranks.
A rank failure closes the world (its peers may be stuck in a collective) and raises RankError;
`reset()` (or `launch()`) brings the same plan back.
"""
from __future__ import annotations

import importlib
import os
import threading
import time

from kernels.mesh import Plan, PlanError

# name -> (label, plan fields); "custom" is whatever the mesh editor holds
PRESETS: dict[str, tuple[str, dict]] = {
    "single": ("single process", {}),
    "dp": ("DP naive", {"dp": 2}),
    "dp-bucketed": ("DP bucketed", {"dp": 2, "grad_sync": "bucketed"}),
    "zero1": ("ZeRO-1", {"dp": 2, "zero": 1}),
    "zero2": ("ZeRO-2", {"dp": 2, "zero": 2}),
    "zero3": ("ZeRO-3", {"dp": 2, "zero": 3}),
    "tp": ("TP", {"tp": 2}),
    "tp-sp": ("TP + SP", {"tp": 2, "sp": True}),
    "gpipe": ("PP GPipe", {"pp": 2, "schedule": "gpipe", "microbatches": 4}),
    "1f1b": ("PP 1F1B", {"pp": 2, "schedule": "1f1b", "microbatches": 4}),
    "interleaved": ("PP interleaved", {"pp": 2, "schedule": "interleaved", "microbatches": 4,
                                       "virtual_stages": 2}),
    "zb1p": ("PP zero-bubble", {"pp": 2, "schedule": "zb1p", "microbatches": 4}),
    "dualpipe": ("PP DualPipe", {"pp": 2, "schedule": "dualpipe", "microbatches": 4}),
    "dualpipev": ("PP DualPipeV", {"pp": 2, "schedule": "dualpipev", "microbatches": 4}),
    "ring": ("CP ring", {"cp": 2, "cp_mode": "ring"}),
    "zigzag": ("CP zigzag", {"cp": 2, "cp_mode": "zigzag"}),
    "ulysses": ("CP Ulysses", {"cp": 2, "cp_mode": "ulysses"}),
    "gshard": ("EP GShard", {"dp": 2, "ep": 2, "experts": 4}),
    "custom": ("custom", {}),
}
# (does the plan use it?, module, attribute) for every engine part written separately
ENGINE_PARTS = (
    (lambda f: f.get("grad_sync") == "bucketed" and not f.get("zero"), "kernels.dp.sync", "BucketedDP"),
    (lambda f: f.get("zero", 0) > 0, "kernels.dp.zero", "make_zero"),
    (lambda f: f.get("tp", 1) > 1, "kernels.tp.layers", "build_tp_layers"),
    (lambda f: f.get("pp", 1) > 1, "kernels.pp.executor", "PipelineRunner"),
    (lambda f: f.get("cp", 1) > 1, "kernels.cp.core", "apply_context_parallel"),
    (lambda f: f.get("ep", 1) > 1 or f.get("experts", 0) > 0, "kernels.ep.layer", "build_moe"),
    (lambda f: bool(f.get("overlap")), "kernels.ep.overlap", "OverlapRunner"),
)
SHOW_WHAT = ("params", "grad", "optim")
TRACE_DIR = "traces"


def engine_gap(fields: dict) -> str | None:
    """None when the engine can run a plan with these fields, else which part is missing
    (decided by importing the module the engine would call)."""
    for uses, mod, attr in ENGINE_PARTS:
        if not uses(fields):
            continue
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            return f"not implemented yet ({e.name} is missing)"
        except Exception as e:  # noqa: BLE001 - a half-written module: say so, do not crash the UI
            return f"{mod} fails to import: {type(e).__name__}: {e}"
        if not hasattr(m, attr):
            return f"not implemented yet ({mod}.{attr} is missing)"
    return None


def preset_status(name: str) -> str | None:
    return engine_gap(PRESETS[name][1])


def make_plan(preset: str = "custom", model: str = "tiny", model_overrides: dict | None = None,
              check_engine: bool = True, **fields):
    """(validated Plan, ModelConfig) from a preset and field overrides; PlanError / ValueError
    with the Plan's own message when the mesh does not fit the model, or when the engine part
    the plan needs is not written yet (check_engine)."""
    from kernels.engine import model_config_for
    from kernels.mesh import validate
    from kernels.model import make_config
    key = preset.lower().replace("_", "-")
    if key not in PRESETS:
        raise PlanError(f"unknown preset {preset!r}: pick one of {', '.join(PRESETS)}")
    kw = dict(PRESETS[key][1])
    kw.update({k: v for k, v in fields.items() if v is not None})
    if kw.get("schedule") == "interleaved" and kw.get("virtual_stages", 1) == 1:
        kw["virtual_stages"] = 2
    try:
        plan = Plan(**kw)
    except TypeError as e:
        raise PlanError(f"{e}: plan fields are {', '.join(Plan.__dataclass_fields__)}") from None
    cfg = make_config(model, **(model_overrides or {}))
    plan = validate(plan, model_config_for(plan, cfg), plan.world or None)
    gap = engine_gap(plan.to_dict()) if check_engine else None
    if gap:
        raise PlanError(f"{plan.describe()}: {gap}; pick another preset")
    return plan, cfg


def aggregate(items: list[dict]) -> dict:
    """One step line from every rank's summary (loss of rank 0, slowest rank's time)."""
    return {"step": items[0]["step"], "loss": items[0]["loss"],
            "step_ms": max(i["step_ms"] for i in items), "ranks": items}


class World:
    def __init__(self, timeout_s: float = 120.0, seed: int = 0, optim: str = "adamw",
                 lr: float | None = None):
        self.timeout_s, self.seed, self.optim, self.lr = timeout_s, seed, optim, lr
        self.preset: str | None = None
        self.current_plan = self.cfg = self.controller = None
        self.infos: list[dict] = []
        self.history: list[dict] = []      # one aggregated line per step since launch
        self.recording = False
        self._traced: list[list[dict]] = []  # one list per recorded window, one entry per rank
        self._traced_steps: list[int] = []
        self.trace_path: str | None = None
        self._lock = threading.RLock()

    # ---------------------------------------------------------------- plan and lifecycle
    def plan(self, preset: str = "custom", model: str = "tiny", **fields) -> Plan:
        """Validate and remember a plan (closing a running world); `launch()` starts it."""
        model_kw = {k: fields.pop(k) for k in ("layers", "dim", "heads", "kv_heads", "seq",
                                               "batch", "vocab") if k in fields}
        plan, cfg = make_plan(preset, model, model_kw, **fields)
        with self._lock:
            self.close()
            self.preset, self.current_plan, self.cfg = preset, plan, cfg
        return plan

    @property
    def launched(self) -> bool:
        return self.controller is not None and not self.controller.closed

    def launch(self, on_progress=None) -> list[dict]:
        """Start the ranks and build every engine; per rank its info (label, role, ledger)."""
        from partui.world import Controller
        if self.current_plan is None:
            raise RuntimeError("no plan yet: call plan('dp', dp=2) (or `plan dp dp=2`) first")
        with self._lock:
            self.close()
            say = on_progress or (lambda msg: None)
            ctl = Controller.launch(self.current_plan.world, self.timeout_s, on_progress)
            say("building engines")
            self.infos = ctl.setup(self.current_plan, self.cfg, seed=self.seed, optim=self.optim,
                                   lr=self.lr)
            self.controller, self.history = ctl, []
            say(f"{self.current_plan.world} ranks ready")
            return self.infos

    def reset(self, on_progress=None) -> list[dict]:
        """The same plan from step 0 (a fresh world)."""
        return self.launch(on_progress)

    def close(self, wait_s: float = 30.0) -> None:
        """Tear the ranks down (waiting up to wait_s for a step in flight); never raises."""
        got = self._lock.acquire(timeout=wait_s)
        try:
            if self.controller is not None:
                self.controller.close()
            self.controller, self.recording = None, False
            self._traced, self._traced_steps = [], []
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
        state = f"step {len(self.history)}" if self.launched else "not launched"
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
        from partui.world import RankError, WorldTimeout
        try:
            return fn(self._ctl())
        except (RankError, WorldTimeout):
            self.controller, self.recording = None, False
            raise

    def step(self, n: int = 1) -> list[dict]:
        """n steps; one aggregated line per step (per-rank summaries under "ranks")."""
        if n < 1:
            raise ValueError(f"step {n}: the number of steps must be >= 1")
        with self._lock:
            first = len(self.history)
            per_rank = self._guard(lambda c: c.step(n))
            lines = [aggregate([r[i] for r in per_rank]) for i in range(n)]
            self.history += lines
            if self.recording:
                self._traced_steps += range(first, first + n)
            return lines

    def run(self, n: int, on_step=None, should_stop=None) -> list[dict]:
        """n single steps, calling on_step(line) after each; stops early when should_stop()."""
        out = []
        for _ in range(n):
            if should_stop is not None and should_stop():
                break
            line = self.step(1)[0]
            out.append(line)
            if on_step is not None:
                on_step(line)
        return out

    def losses(self) -> list[float]:
        return [ln["loss"] for ln in self.history]

    # ---------------------------------------------------------------- inspection
    def snapshot(self, full: list[str] | None = None) -> list[dict]:
        with self._lock:
            return self._guard(lambda c: c.snapshot(full))

    def show(self, rank: int, what: str = "params", name: str | None = None) -> list[dict]:
        """Rows of one rank's params, grads or optimizer state; `name` filters (substring)."""
        what = {"param": "params", "grads": "grad", "optimizer": "optim"}.get(what, what)
        if what not in SHOW_WHAT:
            raise ValueError(f"show {what!r}: pick one of {', '.join(SHOW_WHAT)}")
        world = self.current_plan.world if self.current_plan else 0
        if not 0 <= rank < max(world, 1):
            raise ValueError(f"rank {rank} is outside the world of {world}: pick 0..{world - 1}")
        snap = self.snapshot()[rank]
        rows = snap["optimizer"] if what == "optim" else snap["params"]
        if name:
            rows = [r for r in rows if name in r["name"]]
            if not rows:
                raise ValueError(f"rank {rank} holds no parameter matching {name!r}")
        return rows

    # ---------------------------------------------------------------- tracing
    def trace_on(self, sparse: bool = True) -> None:
        with self._lock:
            if not self.recording:
                self._guard(lambda c: c.trace_start(sparse))
                self.recording = True

    def trace_off(self) -> None:
        with self._lock:
            if self.recording:
                self._traced.append(self._guard(lambda c: c.trace_stop()))
                self.recording = False

    def trace_save(self, name: str = "") -> str:
        """Merge what was recorded into traces/NAME.json (for Perfetto); returns the path."""
        import torch
        from partui.trace import merge
        with self._lock:
            self.trace_off()
            if not self._traced:
                raise RuntimeError("nothing recorded: trace_on(), step, then trace_save(name)")
            name = name or time.strftime("app-%Y%m%d-%H%M%S")
            path = name if name.endswith((".json", ".json.gz")) else os.path.join(TRACE_DIR,
                                                                                   name + ".json")
            per_rank = [dict(ev) for ev in self._traced[0]]
            for chunk in self._traced[1:]:
                for r, ev in enumerate(chunk):
                    per_rank[r]["events"] = per_rank[r]["events"] + ev["events"]
                    per_rank[r]["t1_us"] = ev["t1_us"]
            steps = self._traced_steps or [len(self.history)]
            from partui.analysis.metrics import usable_cpus
            meta = {"plan": self.current_plan.to_dict(), "model": self.cfg.to_dict(),
                    "torch": torch.__version__, "cpus": usable_cpus(), "steps": [min(steps), max(steps)],
                    "ranks": [i["label"] for i in self.infos], "command": "partui app"}
            self.trace_path = merge(per_rank, path, meta)
            self._traced, self._traced_steps = [], []
            return self.trace_path

    def report(self, by: str = "rank", path: str | None = None):
        """The overlap table (pandas DataFrame) of the last saved trace, by rank or step."""
        from partui.analysis.metrics import load, overlap
        path = path or self.trace_path
        if path is None:
            raise RuntimeError("no trace saved yet: trace_on(), step, trace_save(name), report()")
        return overlap(load(path), by=by)
