"""A number field of the setup form, made from its Plan field's metadata (planning.field_spec):
digits only, no longer than its range's upper bound (a number can never grow past what the Plan
takes, so a large one is refused at once), escape leaves it, and the keys that are commands on the
screen (`:`, `?`, `q`) reach the screen instead of being refused as non-digits."""
from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.widgets import Input

SCREEN_KEYS = (":", "?", "q")   # the setup screen's command line, help and quit


def range_text(spec) -> str:
    """What the field takes, from its metadata: `1 to 1024`, `one of 0, 1, 2, 3`."""
    if spec.choices:
        return "one of " + ", ".join(map(str, spec.choices))
    low = f"{spec.ge}" if spec.ge is not None else f"above {spec.gt}" if spec.gt is not None else "any"
    return f"{low} to {spec.le}" if spec.le is not None else f"{low} or more"


class NumberInput(Input):
    BINDINGS = [Binding("escape", "leave", "leave field")]

    def __init__(self, value, spec, **kw):
        """spec: the field's FieldSpec (kind int or float; its upper bound, le or the largest
        choice, sets how many digits it takes)."""
        top = spec.le if spec.le is not None else max(spec.choices, default=None)
        super().__init__(str(value), type="integer" if spec.kind is int else "number",
                         max_length=len(str(int(top))) if top is not None else 0,
                         tooltip=f"{spec.help} ({range_text(spec)})", **kw)
        self.spec = spec

    def check_consume_key(self, key: str, character: str | None) -> bool:
        """The screen's keys are not this field's (so their bindings fire and the footer shows them)."""
        return character not in SCREEN_KEYS and super().check_consume_key(key, character)

    async def _on_key(self, event: events.Key) -> None:
        if event.character in SCREEN_KEYS:
            event.prevent_default()     # not typed (never a digit): the screen's binding takes it

    def action_leave(self) -> None:
        self.screen.set_focus(None)
