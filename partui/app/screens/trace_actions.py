"""The app's trace verbs: record on/off, save, and the overlap report drawn in the trace panel.
Mixed into PartuiApp; saving and analysis run in thread workers."""
from __future__ import annotations

from textual import on, work
from textual.widgets import Button, Input

from partui.app.widgets.inspector import Inspector
from partui.app.widgets.timeline import render
from partui.world.launch import RankError, WorldTimeout
from partui.world.world_trace import trace_target
from planning.link import LinkModel


def save_refused(name: str, e: OSError) -> str:
    """Why a trace could not be written, naming the path asked for (not the temp file written
    first), and a save that works: the recording is kept for it."""
    target = trace_target(name) if name else trace_target("app-TIME")
    return (f"cannot write the trace to {target}: {e.strerror or e}; the recording is kept: "
            f"`trace save NAME` writes {trace_target('NAME')} (or name a .json in a folder you "
            f"can write)")


class TraceMixin:
    def action_trace_toggle(self) -> None:
        self._trace("off" if self.world.recording else "on")

    def _trace(self, action: str, name: str = "") -> None:
        if self.run_screen() is None:
            self.notify("launch a world first: tracing records its steps")
            return
        if self._begin():
            self._trace_worker(action, name)

    @work(thread=True, group="world")
    def _trace_worker(self, action: str, name: str) -> None:
        try:
            saved = False
            if action == "on":
                self.world.trace_on()
            elif action == "off" and not self.world.recorded_steps():
                self.world.trace_off()
                self.call_from_thread(self.notify, "recording off: no step was recorded, "
                                                   "nothing to save")
            else:  # off keeps what was recorded: saved under an automatic name
                try:
                    self.world.trace_save(name)
                except OSError as e:      # the recording stays on the world: saved by the next try
                    self.call_from_thread(self.notify, save_refused(name, e), title="trace save",
                                          severity="error", timeout=12)
                    self.call_from_thread(self._trace_state)
                    return
                saved = True
            self.call_from_thread(self._trace_state)
            if saved:
                self._report()
        except (RankError, WorldTimeout) as e:
            self.call_from_thread(self.fail, "rank failure while tracing", e)
        except Exception as e:  # noqa: BLE001 - a trace that fails to save must not end the app
            self.call_from_thread(self.fail, f"trace {action} failed", e)
        finally:
            self.call_from_thread(self._end)

    def _trace_state(self) -> None:
        rs = self.run_screen()
        if rs is not None:
            rs.query_one("#trace-panel").set_recording(self.world.recording)
            rs.update_status()

    def _report(self) -> None:
        """In a worker: load the saved trace with pandas, build both tables and the timeline."""
        # lazy: the analysis brings pandas (~0.5 s), which must not delay the app's first frame
        from partui.analysis import fb_pair_a2a, load, overlap, pair_summary
        df = load(self.world.trace_path)
        by_rank, by_step = overlap(df, by="rank"), overlap(df, by="step")
        last = by_step["step"].max() if len(by_step) else None
        pairs = fb_pair_a2a(df)
        saved, line = self._saved()
        self.call_from_thread(self._show_report, self.world.trace_path, by_rank, by_step, df, last,
                              pairs, pair_summary(pairs), self.world.trace_about())
        self.call_from_thread(self._show_saved, saved, line)

    def _saved(self):
        """(table, line): the saved trace's op graph replayed under the current link with and
        without overlap (partui.analysis.replay.whatif.saved); no table without a link."""
        from partui.analysis import (  # lazy: pandas
            SAVED_COLUMNS,
            TraceError,
            blame_text,
            definitions_of,
            partui_graphs,
            read_doc,
            saved,
        )
        try:                                       # the slowest worker, its cost, the top rows
            blame = blame_text(partui_graphs(read_doc(self.world.trace_path))) + "\n"
        except TraceError as e:
            blame = f"blame: {e}\n"
        if not self.world.link:
            return None, (blame + "in flight / saved: no emulated link; `link h800` (or link "
                          "alpha_us=A,gbps=B) and save a trace to see what overlap saves on it")
        link = LinkModel.from_dict(self.world.link)
        try:
            table = saved(read_doc(self.world.trace_path), link)
        except TraceError as e:
            return None, blame + f"in flight / saved: {e}"
        step = table[table["rank"] == "step"].iloc[0]
        legend = "; ".join(f"{k.replace('_ms', '')}: {v}"
                           for k, v in definitions_of(SAVED_COLUMNS[1:]).items())
        return table, (blame + f"under {link.describe()}: overlap saves {step['saved_ms']:.1f} ms a step "
                       f"({step['no_overlap_step_ms']:.1f} ms without it, {step['predicted_step_ms']:.1f} "
                       f"ms as recorded; replayed, slowest rank).\n{legend}")

    def _show_saved(self, table, line: str) -> None:
        rs = self.run_screen()
        if rs is not None:
            rs.query_one("#trace-panel").show_saved(table, line)

    def _show_report(self, path, by_rank, by_step, df, last, pairs, pair_line: str, about: str) -> None:
        rs = self.run_screen()
        if rs is not None:
            panel = rs.query_one("#trace-panel")
            # the timeline fits the tabs' width (the trace tab may be hidden: size 0), no wrapping
            width = max(20, rs.query_one(Inspector).size.width - 8)
            tl = render(df, width=width, step=None if last is None or last != last else last)
            panel.show_report(path, by_rank, by_step, tl, pairs, pair_line, about)
            rs.select(rs.selected, what="trace")
            self.notify(f"{path}: {about}", title="trace")

    @work(thread=True, group="world")
    def _report_worker(self) -> None:
        try:
            if self.world.trace_path is None:
                raise RuntimeError("no trace saved yet: trace on, step, trace off (or trace save "
                                   "NAME)")
            self._report()
        except Exception as e:  # noqa: BLE001
            self.call_from_thread(self.fail, "report failed", e)

    @on(Button.Pressed, "#trace-record")
    def _record_pressed(self) -> None:
        self.action_trace_toggle()

    @on(Button.Pressed, "#trace-save")
    def _save_pressed(self) -> None:
        self._trace("save", self.screen.query_one("#trace-name", Input).value.strip())
