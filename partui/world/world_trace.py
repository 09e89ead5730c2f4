"""A World's trace windows: recording on the ranks (partui.recording.trace), torch.profiler
(partui.recording.profile),
merging every window into one Chrome trace with the run's metadata, and the report of it. A mixin
of partui.World: the methods take the World's lock and talk to its ranks through its guard."""
from __future__ import annotations

import importlib.metadata
import os
import time

from partui.recording.machine import usable_cpus
from partui.recording.tracefile import merge, stitch
from planning.mesh import Plan

TRACE_DIR = "traces"


def trace_target(name: str) -> str:
    """Where trace_save(name) writes: NAME.json or NAME.json.gz as given, else traces/NAME.json."""
    return name if name.endswith((".json", ".json.gz")) else os.path.join(TRACE_DIR, name + ".json")



class TraceWindows:
    """Recording, saving and reporting the World's traces (partui.World inherits them)."""

    def trace_on(self, sparse: bool = True) -> None:
        with self._lock:
            if not self.recording:
                self._guard(lambda c: c.trace_start(sparse))
                self.recording, self._window_from = True, len(self._traced_steps)

    def trace_off(self, keep: bool = True) -> list[dict]:
        """Stop recording; the window joins the next trace_save unless keep=False (benches).
        Returns the window (one dict per rank, its "events"); [] when nothing was recording."""
        with self._lock:
            if not self.recording:
                return []
            window = self._guard(lambda c: c.trace_stop())
            self.recording = False
            if keep:
                self._traced.append(window)
            else:
                for step in self._traced_steps[self._window_from:]:
                    self._traced_routing.pop(step, None)
                del self._traced_steps[self._window_from:]
            return window

    def profile(self, folder: str | None) -> list[str]:
        """torch.profiler on every rank into `folder` (partui.recording.profile), or with None stop it and
        write each rank's Kineto file there; returns their paths (none when starting)."""
        with self._lock:
            if folder is not None:
                self._guard(lambda c: c.call("profile_start", {"dir": folder}))
                return []
            return self._guard(lambda c: c.call("profile_stop", {}))

    def trace_save(self, name: str = "", command: str = "partui app", fetched_only: bool = False) -> str:
        """Merge what was recorded into one Chrome trace (Perfetto; `partui report`): NAME.json or
        NAME.json.gz as given, else traces/NAME.json. Returns the path. fetched_only: the windows
        already fetched from the ranks, without asking them for the open one (after a rank died)."""
        with self._lock:
            if fetched_only:
                if self.recording:        # the open window stays on the ranks: not its steps
                    del self._traced_steps[self._window_from:]
                self.recording = False
            self.trace_off()
            if not self._traced:
                raise RuntimeError("nothing recorded: trace_on(), step, then trace_save(name)")
            path = trace_target(name or time.strftime("app-%Y%m%d-%H%M%S"))
            steps = self._traced_steps or [self.steps_done]
            meta = {"plan": self.current_plan.to_dict(), "model": self.cfg.to_dict(),
                    "torch": importlib.metadata.version("torch"), "cpus": usable_cpus(),
                    "steps": [min(steps), max(steps)], "ranks": [i["label"] for i in self.infos],
                    "command": command, "saved_at": time.strftime("%Y-%m-%d %H:%M:%S")}
            routing = {str(step): layers for step, layers in self._traced_routing.items()
                       if step in set(steps)}
            if routing:   # the routing observatory of the traced steps, for `partui report --routing`
                meta["routing"] = routing
            if self.link:
                meta["link"] = dict(self.link, describe=self.link_text())
            self.trace_path = merge(stitch(self._traced), path, meta)
            self.trace_meta = meta
            self._traced, self._traced_steps, self._traced_routing = [], [], {}
            return self.trace_path

    def recorded_steps(self) -> list[int]:
        """Steps recorded since the last save (the open window's too)."""
        return list(self._traced_steps)

    def trace_about(self) -> str:
        """Whose trace the last save is and when it was recorded; flags one of an earlier plan."""
        if self.trace_path is None:
            return "no trace saved yet"
        m = self.trace_meta
        plan = Plan.from_dict(m["plan"])
        first, last = m["steps"]
        steps = f"step {first}" if first == last else f"steps {first}–{last}"
        out = f"trace of {plan.describe()} · world {plan.world} · {steps} · saved {m['saved_at']}"
        if self.current_plan is not None and self.current_plan.to_dict() != m["plan"]:
            out += f" · an earlier world's, not the running {self.current_plan.describe()}"
        return out

    def report(self, by: str = "rank", path: str | None = None):
        """The overlap table (pandas DataFrame) of the last saved trace, by rank, step or op."""
        # lazy: the analysis imports pandas; the app loads it on its first report, not at start
        from partui.analysis import load, overlap
        path = path or self.trace_path
        if path is None:
            raise RuntimeError("no trace saved yet: trace_on(), step, trace_save(name), report()")
        return overlap(load(path), by=by)
