"""The help screen, the error dialog (a failure names what happened; the app stays usable) and a
scrolling text dialog (the reshard map, the doctor's verdict)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Static

HELP = """\
# partui

**Setup**: pick a preset (↑↓), edit the mesh (tab moves between fields), read the status
line: it validates live with the Plan's own message. **ctrl+g / Mesh** shows every rank of the
plan before launching (coordinates, groups, experts, memory, stages: what `partui plan` prints).
**Enter / Launch** (ctrl+l) starts the world. Back from the run screen (`p`), the form holds the
running plan.

**Run**: `s` one step · `n` ten steps · `r` run until `r` again (pause) · `x` reset (step 0, same plan) ·
`t` trace record on / off (off saves what was recorded and shows its report) ·
`[` `]` previous / next rank (or click a card) · `p` back to setup (the running plan).
Tabs (keys `1`–`7`): `1` Params, `2` Grads (each gradient's own piece: ZeRO-2/3 hold a flat
shard, "not held here" where another rank holds it), `3` Optim (AdamW m, v, step), `4` Shards
(the highlighted parameter across ranks), `5` Trace (overlap report per rank and step, whose
trace it is and when it was saved, a text timeline: F light, B dark, W grey, comm in flight ▔,
and the path to open in https://ui.perfetto.dev), `6` Routing (MoE load per expert), `7` Memory (each rank's memory at its peak of the last step,
by kind).
**One set of figures**: the rank cards (comp, comm, ovl, exp: the last step), the step lines,
`World.step().to_pandas()` and the Trace tab count alike, as `partui report --help` defines:
compute = leaf compute spans merged (a step, an F&B pair, a microbatch never; waits and posting
an op never); comm = each op in flight from its issue to its completion (a p2p pair from the
send's post to the recv's completion), merged; ovl = comm while computing; exposed = comm - ovl.
The Trace tab's columns, in ms or %: window, compute, comm, ovl, exposed, idle (neither compute
nor comm), ovl% (ovl / comm), bubble% (100 - compute / window); pipelines add a table of pipe%
(the bubble inside the pipeline window), sim% (the simulator's replay of this trace), ideal%
(the schedule's own) and formula% (the published formula's bubble, as a % of the ideal
simulated step).
Under 100 columns the rank cards hide so the tabs fit: `c` shows / hides them.

**Command line** (`:` focuses it, esc leaves it; keys typed there are text, never bindings;
a leading `:` is fine; ↑↓ history, tab completes), also in the palette (ctrl+p):

- `plan zero2 dp=2`: plan a preset with fields and launch it (a bool field: `sp=on`, `sp=off`)
- `launch`, `reset`: start / restart the planned world
- `step 3`, `run 20`, `pause`: train
- `show rank 1 optim layers.1`: select rank 1, Optimizer tab, filter names
- `show rank 1 params` (or `grad`, `optim`, `shards`, `trace`): rank 1 and that tab
- `trace on`, `trace off`, `trace save NAME`: record; off saves traces/app-TIME.json, save
  names it
- `report`: overlap report of the last saved trace
- `link h800`, `link alpha_us=2000,gbps=0.02`, `link off`: an emulated link from the next step
- `slow 1=1.5`, `slow stage 0=2`, `slow off`: a straggler from the next step: rank 1's (or
  stage 0's) compute 1.5x (2x) as long; off clears it
- `save ckpt`, `load ckpt`, `map ckpt`: checkpoint, resume, show the reshard (DCP)
- `doctor`: the flight recorder's verdict and each rank's last ops
- `quit`: tear the world down and leave (also q, ctrl+c)

After a command the keys go back to the screen: `s` steps again.

The same verbs are a Python API: `partui repl`, or `from partui import World`.
"""


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def on_mount(self) -> None:
        self.app.clear_notifications()   # no toast over the help

    def compose(self) -> ComposeResult:
        from textual.widgets import Markdown  # lazy: markdown-it adds ~75 ms to the first frame
        with Vertical(id="help-box", classes="dialog"):
            with VerticalScroll(classes="dialog-body"):    # the button below stays on screen
                yield Markdown(HELP)
            yield Button("Close (esc)", id="help-close", compact=True)

    def on_button_pressed(self, _event) -> None:
        self.dismiss()


class ErrorDialog(ModalScreen):
    """What failed, the message, and (for a rank failure) the tail of its traceback."""

    BINDINGS = [Binding("escape,enter", "dismiss", "close")]

    def __init__(self, title: str, message: str, detail: str = ""):
        super().__init__()
        self.title_text, self.message, self.detail = title, message, detail

    def on_mount(self) -> None:
        self.app.clear_notifications()   # the dialog says it: no toast over it

    def compose(self) -> ComposeResult:
        with Vertical(id="error-box"):
            yield Static(self.title_text, id="error-title")
            yield Static(self.message, id="error-message", markup=False)
            if self.detail:
                with VerticalScroll(id="error-detail"):
                    yield Static(self.detail, markup=False)
            yield Button("OK (esc)", variant="error", id="error-ok", compact=True)

    def on_button_pressed(self, _event) -> None:
        self.dismiss()


class TextDialog(ModalScreen):
    """A titled text that may be long (the reshard map, the doctor's verdict): it scrolls above
    its Close button."""

    BINDINGS = [Binding("escape,enter,q", "dismiss", "close")]

    def __init__(self, title: str, text: str):
        super().__init__()
        self.title_text, self.text = title, text

    def on_mount(self) -> None:
        self.app.clear_notifications()

    def compose(self) -> ComposeResult:
        with Vertical(id="text-box", classes="dialog"):
            yield Static(self.title_text, id="text-title")
            with VerticalScroll(classes="dialog-body"):
                yield Static(self.text, id="text-body", markup=False)
            yield Button("Close (esc)", id="text-close", compact=True)

    def on_button_pressed(self, _event) -> None:
        self.dismiss()

