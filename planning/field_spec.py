"""A Plan field that describes itself: plan_field() puts its kind, choices or range, help, dimension
and label in the dataclass field's metadata; FieldSpec reads it back and says what is wrong with a
value; PlanError is the one error a plan raises (planning.mesh builds the Plan from these)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from functools import cache


TRUE_WORDS = ("on", "true", "yes", "1")    # how a bool field is typed (FieldSpec.parse)
FALSE_WORDS = ("off", "false", "no", "0")


class PlanError(ValueError):
    """An invalid plan; the message names the numbers and a fix. `field`: the Plan field refused at
    construction; `candidates`: its fixes, unverified; `fixes`: the verified ones (planning.validate);
    `check`: the ordinal of planning.validate's failing check (0: refused at construction)."""

    def __init__(self, *args, field: str | None = None, problem: str = "", candidates=()):
        super().__init__(*args)
        self.field, self.problem, self.candidates = field, problem, list(candidates)
        self.fixes: list[dict] = []
        self.check = 0


def plan_field(default, help: str, *, kind: type = int, dim: str = "", choices: tuple = (),
               ge=None, gt=None, le=None, label: str = "", form: int = 0, grid: int | None = None):
    """A Plan field with its description: kind (int, float, bool, str), choices or a range (ge: >=,
    gt: >, le: <=, so any number answers at once), help, the dimension it belongs to, the label its messages use, its place in the app's
    setup form (0: not shown), and for the four grid dimensions their place in the rank number.
    A Sequence of choices is kept as it is: a live one (the schedule catalogue's) sees later entries."""
    return field(default=default, metadata={
        "kind": kind, "help": help, "dim": dim, "choices": choices if isinstance(choices, Sequence) else tuple(choices), "ge": ge, "gt": gt, "le": le,
        "label": label, "form": form, "grid": grid})


@dataclass(frozen=True)
class FieldSpec:
    """One Plan field as the generators read it (planning.mesh.field_specs)."""
    name: str
    kind: type
    default: object
    help: str
    dim: str = ""
    choices: tuple = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    label: str = ""
    form: int = 0             # place in the app's setup form (0: not shown)
    grid: int | None = None
    section: str = ""         # the concern it belongs to: the SECTION of the class declaring it

    @property
    def optional(self) -> bool:
        """None is a value (not given: derived or the model's own)."""
        return self.default is None

    def problem(self, value) -> tuple[str, list[dict]] | None:
        """(message, candidate fixes) when value is not one this field takes, else None."""
        label = self.label or self.name
        if value is None:
            return None if self.optional else (f"{label} must be given", [{self.name: self.default}])
        ok_kind = (isinstance(value, bool) if self.kind is bool else
                   isinstance(value, self.kind) and not isinstance(value, bool) or
                   self.kind is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok_kind:
            return (f"{label} {value!r} is not {self.kind.__name__}",
                    [{self.name: self.default}] if self.default is not None else [])
        if self.kind is float and not math.isfinite(value):   # nan passes every comparison
            return f"{label} {value} is not a finite number", self.finite_fixes()
        if self.choices and value not in self.choices:   # every choice named; the fixes: those valid here
            return (f"unknown {label} {value!r} (the {label} choices: "
                    f"{', '.join(map(str, self.choices))})", [{self.name: c} for c in self.choices])
        for bound, sign in ((self.ge, ">="), (self.gt, ">")):
            if bound is not None and (value < bound if sign == ">=" else value <= bound):
                # a number first (the value's opposite, else one above a strict bound), then the
                # default (None: leave the flag out), so no fix offered is only "unset it"
                above = self.kind(bound + 1) if sign == ">" and self.default is None else None
                number = -value if -value > bound else above
                fixes = [{self.name: number}] if number is not None else []
                fixes += ([{self.name: self.default}] if self.default != value else
                          [{self.name: bound}] if sign == ">=" else [])
                return f"{label} {value} must be {sign} {bound}", fixes
        if self.le is not None and value > self.le:
            return (f"{label} {value} must be <= {self.le}",
                    [{self.name: self.default}] if self.default else [])   # 0 / None: derived
        return None


    def parse(self, word: str):
        """A typed word (the app's `key=value`, a form's text) as a value of this field's kind;
        PlanError naming the word and what the field takes. One reading of on / off for every
        bool: anything else is refused, never quietly False."""
        label = self.name                    # the key as typed (`top_k=1.5`), not the form's label
        if self.kind is bool:
            said = word.strip().lower()
            if said in TRUE_WORDS or said in FALSE_WORDS:
                return said in TRUE_WORDS
            raise PlanError(f"{label} {word!r} is neither on nor off: use `{self.name}=on` or "
                            f"`{self.name}=off`", field=self.name, problem="not a bool")
        if self.kind in (int, float):
            if self.default is None and word.strip().lower() in ("none", "off"):
                return None                  # a field whose default is None (no limit) takes it back
            try:
                return self.kind(word)
            except ValueError:
                example = "3" if self.kind is int else "1.25"
                raise PlanError(f"{label} {word!r} is not a {'whole number' if self.kind is int else 'number'}: "
                                f"e.g. `{self.name}={example}`", field=self.name,
                                problem="not a number") from None
        return word

    def finite_fixes(self) -> list[dict]:
        """A number this field takes, for a value that is no number at all: its default, else the
        least its range allows (a strict bound: one above it)."""
        if self.default is not None:
            return [{self.name: self.default}]
        if self.ge is not None:
            return [{self.name: self.ge}]
        return [{self.name: self.gt + 1}] if self.gt is not None else []


@cache   # a Plan checks every field at construction: read each class's metadata once
def specs_of(cls) -> tuple[FieldSpec, ...]:
    """The description of every field of a dataclass made of plan_field()s, in field order."""
    return tuple(FieldSpec(f.name, f.metadata["kind"], f.default, f.metadata["help"],
                           **{k: f.metadata[k] for k in ("dim", "choices", "ge", "gt", "le", "label",
                                                          "form", "grid")},
                           section=_section(cls, f.name))
                 for f in fields(cls))


def _section(cls, name: str) -> str:
    """The SECTION of the class in cls's bases that declares field `name` (a dataclass keeps each
    field's default on the class that declares it): Plan's fields by concern (planning.mesh)."""
    return next((vars(c).get("SECTION", "") for c in cls.__mro__ if name in vars(c)), "")


def fix_text(fixes: list[dict]) -> str:
    """`pick tp in 1, 2, 4` when every fix sets the same one field, else `set a=1 b=2 or c=3`."""
    keys = {tuple(f) for f in fixes}
    unset = any(v is None for f in fixes for v in f.values())   # `x=None`: leave it out, said apart
    if len(keys) == 1 and len(next(iter(keys))) == 1 and len(fixes) > 1 and not unset:
        name = next(iter(keys))[0]
        values = [f[name] for f in fixes]
        if all(isinstance(v, int) for v in values):
            values = sorted(values)
        return f"pick {name} in {', '.join(map(str, values))}"
    return "set " + " or ".join(" ".join(f"{k}={v}" for k, v in f.items()) for f in fixes)
