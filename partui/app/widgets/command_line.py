"""The app's command line: parsing (`plan zero3 dp=4`, `step 3`, `show rank 2 grad layers.1.wq`,
...), completion of the next word, and a history walked with up / down."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from textual.binding import Binding
from textual.suggester import Suggester
from textual.widgets import Input

from partui.world.plans import MODEL_FIELDS
from partui.world.show_kinds import APP_KINDS, show_kind
from planning import mesh
from planning.field_spec import FieldSpec, PlanError
from planning.slow_spec import WHO, parse_slow

VERBS = ("plan", "launch", "step", "run", "pause", "reset", "show", "trace", "report", "link",
         "slow", "save", "load", "map", "doctor", "help", "quit")
EXAMPLES = {  # command -> what it does (the palette's help line)
    "plan zero2 dp=2": "plan ZeRO-2 over 2 ranks and launch it",
    "launch": "start the planned world",
    "step 1": "train one step on every rank",
    "step 3": "train three steps",
    "run 20": "train 20 steps, pausable with r",
    "pause": "stop a run after the current step",
    "reset": "relaunch the same plan from step 0",
    "show rank 1 optim": "rank 1's optimizer state (AdamW m, v)",
    "show rank 0 grad layers.1.attn.wq": "rank 0's gradient pieces of layers.1.attn.wq",
    "show rank 0 shards": "how the highlighted parameter is split across ranks",
    "trace on": "record the next steps",
    "trace off": "stop recording; save the trace and show its report",
    "trace save demo": "save what was recorded as traces/demo.json",
    "report": "overlap report of the last saved trace",
    "link h800": "emulate an H800 cluster's links (scaled to this CPU) from the next step",
    "link alpha_us=2000,gbps=0.02": "emulate a link of this latency and bandwidth, unscaled",
    "link off": "back to the plain gloo links",
    "slow 1=1.5": "a straggler: rank 1's compute 1.5x as long from the next step",
    "slow stage 0=2": "every rank of pipeline stage 0 computes 2x as long from the next step",
    "slow off": "no straggler from the next step",
    "save ckpt": "checkpoint the world into ckpt/step-N (torch DCP, each rank its shards)",
    "load ckpt": "resume from a checkpoint saved under any plan (its newest step)",
    "map ckpt": "the reshard: which saved ranks feed which pieces to this plan's ranks, bytes each reads",
    "doctor": "the flight recorder's verdict now: any hang or mismatch, and each rank's last ops",
    "help": "keys and commands",
    "quit": "tear the world down and leave",
}
MODEL_WORDS = {"model": str, **{name: int for name in MODEL_FIELDS}}  # `plan` takes these too


def plan_grammar() -> dict[str, type]:
    """Every key=value `plan` takes and the kind of its value: the Plan's fields (generated from
    their metadata, planning.mesh.field_specs) and the model's sizes."""
    return {**{spec.name: spec.kind for spec in mesh.field_specs()}, **MODEL_WORDS}


class CommandError(ValueError):
    """A command line that does not parse; the message shows the right form."""


@dataclass
class Command:
    verb: str
    args: dict = field(default_factory=dict)


def _int(word: str, what: str, sep: str = " ") -> int:
    try:
        return int(word)
    except ValueError:
        raise CommandError(f"{what} {word!r} is not a whole number: e.g. `{what}{sep}3`") from None


def parse_plan_fields(words: list[str]) -> dict:
    """`dp=2 schedule=1f1b sp=on` -> the fields with values of their kinds; a bad value of a
    field's own range is the Plan's to refuse (one message, naming a fix)."""
    grammar, out = plan_grammar(), {}
    specs = {spec.name: spec for spec in mesh.field_specs()}
    for w in words:
        key, eq, val = w.partition("=")
        key = key.replace("-", "_")
        if not eq:
            raise CommandError(f"plan field {w!r} needs key=value, e.g. dp=2")
        kind = grammar.get(key)
        if kind is None:
            raise CommandError(f"unknown plan field {key!r}: use one of {', '.join(grammar)}")
        spec = specs.get(key) or FieldSpec(key, kind, None, key)   # a model size: a whole number
        try:
            out[key] = spec.parse(val)    # the Plan field's own reading: sp=banana is refused
        except PlanError as e:
            raise CommandError(str(e)) from None
    return out


def parse(text: str) -> Command:
    words = text.strip().removeprefix(":").split()  # `:step 3` as the placeholder shows it
    if not words:
        raise CommandError("empty command: try `step 1` or `help`")
    verb, rest = words[0].lower(), words[1:]
    if verb in ("q", "exit"):
        verb = "quit"
    if verb not in VERBS:
        raise CommandError(f"unknown command {verb!r}: pick one of {', '.join(VERBS)}")
    if verb == "plan":
        if not rest:
            raise CommandError("plan needs a preset: e.g. `plan zero2 dp=2` (see help)")
        return Command("plan", {"preset": rest[0], "fields": parse_plan_fields(rest[1:])})
    if verb in ("step", "run"):
        n = _int(rest[0], verb) if rest else (1 if verb == "step" else 20)
        if n < 1:
            raise CommandError(f"{verb} {n}: the number of steps must be >= 1")
        return Command(verb, {"n": n})
    if verb == "show":
        if len(rest) < 2 or rest[0] != "rank":
            raise CommandError("show needs a rank: `show rank 2 grad layers.1.attn.wq`")
        args = {"rank": _int(rest[1], "rank"), "what": "params", "name": ""}
        for w in rest[2:]:
            kind = show_kind(w)
            if kind in APP_KINDS:
                args["what"] = kind
            else:
                args["name"] = w
        return Command("show", args)
    if verb == "trace":
        sub = rest[0] if rest else ""
        if sub in ("on", "off"):
            return Command("trace", {"action": sub})
        if sub == "save":
            return Command("trace", {"action": "save", "name": rest[1] if len(rest) > 1 else ""})
        raise CommandError("trace needs on, off or save NAME: e.g. `trace on`")
    if verb == "link":
        if not rest:
            raise CommandError("link needs a preset, a spec or off: `link h800 ranks_per_node=2`, "
                               "`link alpha_us=2000,gbps=0.02`, `link off`")
        rpn = None
        for w in rest[1:]:
            key, eq, val = w.partition("=")
            if key.replace("-", "_") != "ranks_per_node" or not eq:
                raise CommandError(f"link takes ranks_per_node=N after the link, not {w!r}")
            rpn = _int(val, "ranks_per_node")
        return Command("link", {"text": None if rest[0] == "off" else rest[0],
                                "ranks_per_node": rpn})
    if verb == "slow":
        return Command("slow", slow_keywords(rest))
    if verb in ("save", "load", "map"):
        if len(rest) != 1:
            raise CommandError(f"{verb} needs one folder: `{verb} ckpt`")
        return Command(verb, {"path": rest[0]})
    return Command(verb)


def slow_keywords(rest: list[str]) -> dict:
    """The words after `slow` (`1=1.5`, `stage 0=2` or `off`) -> World.slow's keywords ({} clears);
    the R=F text is planning.slow_spec's to read."""
    if rest == ["off"]:
        return {}
    field, said = ("slow_stage", "slow stage") if rest[:1] == ["stage"] else ("slow_rank", "slow")
    spec = rest[1:] if field == "slow_stage" else rest
    if len(spec) != 1:
        raise CommandError("slow needs R=F, stage S=F or off: `slow 1=1.5`, `slow stage 0=2`, `slow off`")
    try:
        index, factor = parse_slow(spec[0], field, said)
    except PlanError as e:
        raise CommandError(str(e)) from None
    return {WHO[field][0]: index, "factor": factor}


class CommandSuggester(Suggester):
    """Completes the last word from the verbs, presets, show kinds and known parameter names."""

    def __init__(self, presets: list[str], names_fn):
        super().__init__(use_cache=False, case_sensitive=True)
        self.presets, self.names_fn = presets, names_fn

    def candidates(self, words: list[str]) -> list[str]:
        if len(words) <= 1:
            return list(VERBS)
        verb = words[0]
        if verb == "plan":
            return self.presets if len(words) == 2 else [f"{k}=" for k in plan_grammar()]
        if verb == "trace":
            return ["on", "off", "save"] if len(words) == 2 else []
        if verb == "slow":
            return ["stage", "off"] if len(words) == 2 else []
        if verb == "show":
            if len(words) == 2:
                return ["rank"]
            return [] if len(words) == 3 else list(APP_KINDS) + list(self.names_fn())
        return []

    def matches(self, value: str) -> list[str]:
        """Candidates the last word of value starts (dualpipe and dualpipev for `plan dual`)."""
        words = value.split(" ")
        return [c for c in self.candidates(words) if words[-1] and c.startswith(words[-1])]

    async def get_suggestion(self, value: str) -> str | None:
        """The matches' common prefix: completion stops where they part (`dualpipe`, then a v
        only if typed), so it never jumps past a choice."""
        found = self.matches(value)
        last = value.split(" ")[-1]
        common = os.path.commonprefix(found) if found else ""
        return value + common[len(last):] if len(common) > len(last) else None


class CommandLine(Input):
    """An Input with history (up / down), completion (right arrow or tab accepts); escape
    hands the keys back to the screen."""

    BINDINGS = [Binding("up", "history(-1)", "previous", show=False),
                Binding("down", "history(1)", "next", show=False),
                Binding("tab", "complete", "complete", show=False),
                Binding("escape", "leave", "leave the command line", show=False)]

    def __init__(self, presets: list[str], names_fn, **kw):
        super().__init__(placeholder=": command (step 3, run 20, show rank 1 optim, help)",
                         suggester=CommandSuggester(presets, names_fn), **kw)
        self.history: list[str] = []
        self._pos = 0

    def remember(self, text: str) -> None:
        if text and (not self.history or self.history[-1] != text):
            self.history.append(text)
        self._pos = len(self.history)

    def action_history(self, delta: int) -> None:
        if not self.history:
            return
        self._pos = max(0, min(len(self.history), self._pos + delta))
        self.value = self.history[self._pos] if self._pos < len(self.history) else ""
        self.cursor_position = len(self.value)

    def action_leave(self) -> None:
        self.screen.set_focus(None)  # single-key bindings (s, r, t ...) work again

    def action_complete(self) -> None:
        if self._suggestion:
            self.value = self._suggestion
            self.cursor_position = len(self.value)
            return
        found = self.suggester.matches(self.value) if self.value else []
        if len(found) > 1:               # the word is complete and longer choices share it
            self.app.notify(" or ".join(found), title="complete")
        else:
            self.screen.focus_next()
