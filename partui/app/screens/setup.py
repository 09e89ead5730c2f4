"""Setup: presets, a mesh editor validated live with the Plan's own messages, the model size,
and Launch (in a worker, with visible progress)."""
from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Button, Footer, Header, Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option

from partui.app.screens.mesh import MeshScreen
from partui.app.widgets.command_line import CommandLine
from partui.app.widgets.number_input import NumberInput
from partui.world.plans import build_plan
from partui.recording.machine import usable_cpus
from planning import mesh
from planning.config import PRESETS as MODEL_PRESETS
from planning.mesh import PlanError, coord_label

MODELS = tuple(MODEL_PRESETS)   # every model preset (planning.config), deepseek-tiny included
SWITCH = [("off", False), ("on", True)]   # a bool field's select, worded as the command line takes it
FORM_DEFAULTS = {"dp": 1}   # the form shows dp's value where the Plan's default 0 means "derived"


def form_specs() -> tuple:
    """The Plan fields the form shows, in their places (metadata form, planning.mesh.field_specs):
    a number input for each number, a select for each other field (its choices, or off / on)."""
    return tuple(sorted((spec for spec in mesh.field_specs() if spec.form), key=lambda s: s.form))


def input_names() -> tuple[str, ...]:
    """The form's number inputs."""
    return tuple(s.name for s in form_specs() if s.kind in (int, float))


def defaults() -> dict:
    return {**{s.name: s.default for s in form_specs()}, **FORM_DEFAULTS}


def cores_warning(ranks: int, cores: int | None = None) -> str:
    """A warning when the plan has more ranks than this process may run on (each step then
    time-shares the cores: slower steps, timings that mix the ranks), naming a fix; else ""."""
    cores = cores or usable_cpus()
    if ranks <= cores:
        return ""
    return (f"{ranks} ranks on {cores} cores: they time-share the cores (slower steps, timings "
            f"that mix ranks); at most {cores} ranks run one a core")


def check_plan(fields: dict, model: str) -> tuple:
    """(plan, cfg, None) for a valid form, else (None, None, the Plan's own message)."""
    bad = [k for k in input_names() if isinstance(fields[k], str)]
    if bad:
        return None, None, f"{bad[0]} must be a whole number"
    try:
        plan, cfg = build_plan("custom", model, **fields)
    except (PlanError, ValueError) as e:
        return None, None, str(e)
    return plan, cfg, None


def _number(raw: str, kind: type):
    """The input's value as its kind, or the raw text (revalidate names it)."""
    try:
        return kind(raw)
    except ValueError:
        return raw


class SetupScreen(Screen):
    BINDINGS = [Binding("ctrl+l", "launch", "launch"), Binding("ctrl+g", "mesh", "mesh"),
                Binding("colon", "command", "command"),
                Binding("question_mark", "app.help", "help"),
                Binding("escape", "leave", "leave field", show=False)]   # a select, the presets

    def __init__(self, presets: dict):
        super().__init__(id="setup")
        self.presets = presets            # name -> (label, fields)
        self.plan = self.cfg = self.error = None
        self.extra: dict = {}             # plan fields the form has no input for (grad_sync ...)
        self.highlighted = "single"       # the preset highlighted last
        self._edits = 0                   # edits so far: a check's answer shows if still the newest

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="setup-body"):
            yield OptionList(*[Option(f" {label}", id=name)
                               for name, (label, _) in self.presets.items()], id="presets")
            with Vertical(id="form"):
                numbers, start = input_names(), defaults()
                with Grid(id="mesh-grid"):       # the numbers, three to a row
                    for spec in form_specs():
                        if spec.name in numbers:
                            yield Label(spec.name.replace("_", "-"))
                            yield NumberInput(start[spec.name], spec, id=f"f-{spec.name}",
                                              classes="field")
                with Grid(id="choices"):         # the other fields and the model, two to a row
                    for spec in form_specs():
                        if spec.name not in numbers:
                            values = ([(str(v), v) for v in spec.choices] if spec.choices else
                                      SWITCH if spec.kind is bool else [])
                            label = spec.label or spec.name.replace("_", " ")
                            yield Label(label, classes="select-label")
                            yield Select(values, value=start[spec.name], allow_blank=False,
                                         id=f"f-{spec.name}", prompt=label, tooltip=spec.help,
                                         compact=True)
                    yield Label("model", classes="select-label", id="model-label")
                    yield Select([(m, m) for m in MODELS], value="tiny", allow_blank=False,
                                 id="f-model", compact=True)
                yield Static("", id="model-info")
                yield Static("loading the engine (torch) ...", id="status")
                yield Static("", id="progress")
                with Horizontal(id="buttons"):
                    yield Button("Launch ⏎", variant="primary", id="launch", compact=True)
                    yield Button("Mesh ^g", id="mesh-view", compact=True)
        yield CommandLine(list(self.presets), lambda: [], id="command")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#presets", OptionList).highlighted = 0
        self.query_one("#presets").focus()

    # ---------------------------------------------------------------- presets
    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        name = event.option.id
        self.highlighted = name
        if name != "custom":             # custom: whatever the form holds
            self.fill_form(self.preset_form(name))
        self.revalidate()

    def preset_form(self, name: str) -> dict:
        return dict(defaults(), **self.presets[name][1])

    def preset_name(self) -> str:
        """The highlighted preset while the form holds it unchanged, else custom."""
        name = self.highlighted
        return name if name != "custom" and self.fields() == self.preset_form(name) else "custom"

    def fill_form(self, fields: dict) -> None:
        numbers = input_names()
        for spec in form_specs():
            value = fields[spec.name]
            if spec.name in numbers:
                self.query_one(f"#f-{spec.name}", Input).value = str(value)
            else:
                self.query_one(f"#f-{spec.name}", Select).value = value
        self.extra = {k: v for k, v in fields.items() if k not in defaults()}

    def show_plan(self, plan, model: str) -> None:
        """The form holds the running plan (back from the run screen), not the last preset."""
        fields = plan.to_dict()
        self.fill_form(fields)
        self.extra = {k: v for k, v in fields.items() if k not in defaults() and k != "world"}
        self.query_one("#f-model", Select).value = model
        self.revalidate()

    def on_option_list_option_selected(self, _event) -> None:
        self.action_launch()

    # ---------------------------------------------------------------- the mesh
    def fields(self) -> dict:
        out, numbers = {}, input_names()
        for spec in form_specs():
            if spec.name in numbers:
                raw = self.query_one(f"#f-{spec.name}", Input).value.strip()
                out[spec.name] = _number(raw, spec.kind)
            else:
                out[spec.name] = self.query_one(f"#f-{spec.name}", Select).value
        return dict(self.extra, **out)    # preset-only fields (sp, grad_sync, virtual_stages)

    def model(self) -> str:
        return self.query_one("#f-model", Select).value

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id and event.input.id.startswith("f-"):
            self.revalidate_later()

    def on_select_changed(self, _event) -> None:
        self.revalidate_later()

    def revalidate_later(self) -> None:
        """Validate off the UI thread while the user types: keys are never held up by a check
        (the newest edit's answer is the one shown)."""
        if self.app.engine_ready:
            self._edits += 1
            self._validate_worker(self._edits, self.fields(), self.model())

    @work(thread=True, group="validate")
    def _validate_worker(self, edit: int, fields: dict, model: str) -> None:
        found = check_plan(fields, model)
        if self.app.is_running:
            self.app.call_from_thread(lambda: edit == self._edits and self.show_validation(*found))

    def revalidate(self) -> None:
        """Validate the editor's plan now; the status line shows the Plan's own message."""
        if self.app.engine_ready:
            self._edits += 1   # an answer still in flight is older than this one
            self.show_validation(*check_plan(self.fields(), self.model()))

    def show_validation(self, plan, cfg, error: str | None) -> None:
        self.plan, self.cfg, self.error = plan, cfg, error
        status = self.query_one("#status", Static)
        if self.error:
            status.update(Text(f"✗ {self.error}", style="bold red"))
            status.set_class(True, "-invalid")
            return
        status.set_class(False, "-invalid")
        p = self.plan
        who = "  ".join(f"r{r}={coord_label(p, r)}" for r in range(min(p.world, 4)))
        label = self.presets[self.preset_name()][0]   # GShard, DeepSeek and custom told apart
        text = Text(f"✓ valid: {label} · {p.world} rank{'s' if p.world > 1 else ''} · {p.describe()} · "
                    f"{who}" + (" ..." if p.world > 4 else ""), style="green")
        crowded = cores_warning(p.world)
        if crowded:
            text.append(f"\n! {crowded}", style="yellow")
        status.update(text)
        self.query_one("#model-info", Static).update(
            f"{cfg.n_params() / 1e6:.2f} M params · layers {cfg.layers} · dim {cfg.dim} · heads "
            f"{cfg.heads} · kv {cfg.kv_heads}\nseq {cfg.seq} · batch {cfg.batch} · vocab {cfg.vocab}"
            + (f" · {cfg.experts} experts {cfg.moe or 'gshard'}" if cfg.experts else ""))

    # ---------------------------------------------------------------- launch
    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "launch":
            self.action_launch()
        elif event.button.id == "mesh-view":
            self.action_mesh()

    def form_ready(self) -> bool:
        """Whether the form holds a valid plan and the engine is loaded; else says why."""
        if not self.app.engine_ready:
            self.app.notify("the engine is still loading (torch): a second, please")
            return False
        self.revalidate()
        if self.error:
            self.app.notify(self.error, title="invalid plan", severity="error")
            return False
        return True

    def action_mesh(self) -> None:
        """Every rank of the plan in the form, before launching (what `partui plan` prints)."""
        if self.form_ready():
            self.app.push_screen(MeshScreen(self.plan, self.cfg))

    def action_launch(self) -> None:
        if self.form_ready():
            self.app.launch_world(self.preset_name(), self.model(), self.fields())

    def action_command(self) -> None:
        self.query_one("#command").focus()

    def action_leave(self) -> None:
        self.set_focus(None)   # the screen's keys (: ? q ^l ^g) and tab take over

    def progress(self, msg: str) -> None:
        self.query_one("#progress", Static).update(Text(msg, style="yellow"))
