"""The schedule catalogue: one ScheduleSpec per pipeline schedule, every fact about it in one place
(as planning.field_spec's plan_field is for the Plan's fields).

A record holds the schedule's name, help line and aliases; its builder (the generators stay in
planning/pipeline/schedules.py and dualpipe.py); its shape (chunks per rank, directions, mirrored
ranks, stages, whether W is split from B); which F&B pairs it overlaps; its microbatch rule from the
schedule's published definition; activations in flight per rank; the published bubble; what it
combines with; how often a chunk accumulates a gradient in a step; torch's peer class for the pp
bench; and the preset label. The Plan (planning.mesh), validate, the builders' dispatch, the
simulator's formula row, the memory plan, the CLI, the app and the benches read the record; a new
schedule is one register_schedule(ScheduleSpec(...)) call.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

from planning.pipeline.actions import Schedule
from planning.pipeline.dualpipe import dualpipe, dualpipev
from planning.pipeline.schedules import gpipe, interleaved, one_f_one_b, zb1p


def count_accumulations(schedule: Schedule, rank: int, chunk: int) -> int:
    """A record's default accumulation count: the built schedule's own (Schedule.accumulations: each
    W, BW and FB backward half of the chunk; DualPipe's chunks M/2 times, the others' M)."""
    return schedule.accumulations(rank, chunk)


@dataclass(frozen=True)
class ScheduleSpec:
    """One pipeline schedule: what it is, how it is built and every rule it brings.

    build(pp, microbatches, virtual, fb_overlap) -> Schedule; stages(pp, virtual);
    least(pp), multiple(pp): the microbatch rule (at least least(pp), a multiple of multiple(pp)),
    least_text / multiple_text the same as words, microbatch_source where the rule is published;
    in_flight(pp, rank, microbatches, virtual): microbatch-chunk contexts a rank holds at once;
    bubble(pp, cost, virtual): the published bubble (cost has F, B, W, fb), bubble_text its formula;
    accumulations(schedule, rank, chunk): gradient accumulations of a chunk in one built step."""
    name: str
    description: str
    build: Callable[[int, int, int | None, bool], Schedule]
    stages: Callable[[int, int], int]
    least: Callable[[int], int]
    multiple: Callable[[int], int]
    least_text: str
    multiple_text: str
    microbatch_source: str
    in_flight: Callable[[int, int, int, int], int]
    bubble: Callable[[int, object, int], float]
    bubble_text: str
    preset_label: str
    aliases: tuple[str, ...] = ()
    chunks: int = 1                  # model chunks per rank; 0: the plan's virtual_stages (interleaved)
    default_virtual: int = 1         # chunks when virtual_stages is not given
    directions: int = 1              # DualPipe: 2 pipelines, one each way
    mirrored: bool = False           # ranks r and P-1-r hold the same stages (the pp_mirror group)
    even_pp: bool = False            # needs an even number of pipeline ranks
    split_w: bool = False            # W runs apart from B (deferred weight grads): not with ZeRO-3
    fb_overlap: bool = False         # its F&B pairs can interleave their parts (1f1b: pairs only then)
    torch_peer: tuple[str, str] | None = None   # (torch.distributed.pipelining class, stage layout)
    accumulations: Callable[[Schedule, int, int], int] = count_accumulations

    @property
    def virtual(self) -> bool:
        """Whether the plan's virtual_stages sets its chunks per rank."""
        return self.chunks == 0

    @property
    def zero3(self) -> bool:
        """ZeRO-3 frees a layer's gathered weights after its backward: a deferred W comes too late."""
        return not self.split_w

    def least_count(self, pp: int) -> int:
        """The fewest microbatches the rule takes at pp ranks (least, rounded up to the multiple)."""
        if pp <= 1:
            return 1
        step = self.multiple(pp)
        return max(step, -(-self.least(pp) // step) * step)

    def takes(self, pp: int, microbatches: int) -> bool:
        return pp <= 1 or (microbatches >= self.least(pp) and microbatches % self.multiple(pp) == 0)

    def microbatch_problem(self, pp: int, microbatches: int) -> str | None:
        """The one sentence run, simulate and the app say for a count the rule refuses, else None."""
        if self.takes(pp, microbatches):
            return None
        least, step = self.least(pp), self.multiple(pp)
        rule = (f"microbatches >= {self.least_text} = {least}" if step == 1 else
                f"an even number of microbatches >= {self.least_text} = {least}" if step == 2 else
                f"microbatches a multiple of {self.multiple_text} = {step}" if least <= step else
                f"microbatches >= {self.least_text} = {least} and a multiple of "
                f"{self.multiple_text} = {step}")
        return f"{self.name} needs {rule} ({self.microbatch_source}), got {microbatches}"


def _one_chunk_stages(pp: int, virtual: int) -> int:
    return pp


BUILT_IN = (
    ScheduleSpec(
        "gpipe", "GPipe: every forward, then every backward", lambda p, m, v, fb: gpipe(p, m),
        _one_chunk_stages, least=lambda p: 1, multiple=lambda p: 1, least_text="1", multiple_text="1",
        microbatch_source="GPipe, Huang et al. 2019: any count",
        in_flight=lambda p, r, m, v: m, bubble=lambda p, c, v: (p - 1) * (c.F + c.B),
        bubble_text="(P-1)(F+B)", preset_label="PP GPipe", torch_peer=("ScheduleGPipe", "one")),
    ScheduleSpec(
        "1f1b", "1F1B (PipeDream-flush): warm-up forwards, then one forward one backward",
        lambda p, m, v, fb: one_f_one_b(p, m, fb), _one_chunk_stages,
        least=lambda p: p, multiple=lambda p: 1, least_text="pp", multiple_text="1",
        microbatch_source="1F1B's warm-up fills the pp stages",
        in_flight=lambda p, r, m, v: min(p - r, m), bubble=lambda p, c, v: (p - 1) * (c.F + c.B),
        bubble_text="(P-1)(F+B)", preset_label="PP 1F1B", fb_overlap=True,
        torch_peer=("Schedule1F1B", "one")),
    ScheduleSpec(
        "interleaved", "interleaved 1F1B (Megatron): virtual_stages chunks a rank",
        lambda p, m, v, fb: interleaved(p, m, 2 if v is None else v), lambda p, v: p * v,
        least=lambda p: p, multiple=lambda p: p, least_text="pp", multiple_text="pp",
        microbatch_source="Megatron's interleaved schedule runs microbatches in groups of pp",
        in_flight=lambda p, r, m, v: min((p - r - 1) * 2 + (v - 1) * p + 1, v * m),
        bubble=lambda p, c, v: (p - 1) * (c.F + c.B) / v, bubble_text="(P-1)(F+B)/v",
        preset_label="PP interleaved", chunks=0, default_virtual=2,
        torch_peer=("ScheduleInterleaved1F1B", "loop")),
    ScheduleSpec(
        "zb1p", "zero-bubble ZB-H1: 1F1B with each weight grad (W) deferred into the bubble",
        lambda p, m, v, fb: zb1p(p, m), _one_chunk_stages, aliases=("zero-bubble",),
        least=lambda p: p, multiple=lambda p: 1, least_text="pp", multiple_text="1",
        microbatch_source="ZB-H1 keeps 1F1B's warm-up",
        in_flight=lambda p, r, m, v: p, bubble=lambda p, c, v: (p - 1) * (c.F + c.B - 2 * c.W),
        bubble_text="(P-1)(F+B-2W)", preset_label="PP zero-bubble", split_w=True,
        torch_peer=("ScheduleZBVZeroBubble", "v")),
    ScheduleSpec(
        "dualpipe", "DualPipe (DeepSeek-V3): two directions, rank r holds stages r and P-1-r",
        lambda p, m, v, fb: dualpipe(p, m), _one_chunk_stages,
        least=lambda p: 2 * p, multiple=lambda p: 2, least_text="2 x pp", multiple_text="2",
        microbatch_source="DeepSeek's DualPipe.step asserts an even count >= 2 x ranks",
        in_flight=lambda p, r, m, v: p + 1, bubble=lambda p, c, v: (p / 2 - 1) * (c.fb + c.B - 3 * c.W),
        bubble_text="(P/2-1)(F&B+B-3W)", preset_label="PP DualPipe", chunks=2, directions=2,
        mirrored=True, even_pp=True, split_w=True, fb_overlap=True),
    ScheduleSpec(    # the README's PP counts stages: 2 per rank, so PP/2-1 = ranks-1
        "dualpipev", "DualPipeV (DeepSeek's V-shape): rank r holds stages r and 2P-1-r",
        lambda p, m, v, fb: dualpipev(p, m), lambda p, v: 2 * p,
        least=lambda p: 2 * p, multiple=lambda p: 1, least_text="2 x pp", multiple_text="1",
        microbatch_source="DeepSeek's DualPipeV.step asserts a count >= 2 x ranks, odd or even",
        in_flight=lambda p, r, m, v: 2 * p + 1, bubble=lambda p, c, v: (p - 1) * (c.fb + c.B - 3 * c.W),
        bubble_text="(S/2-1)(F&B+B-3W), S=2P stages", preset_label="PP DualPipeV", chunks=2,
        split_w=True, fb_overlap=True, torch_peer=("ScheduleDualPipeV", "v")),
)
DEFAULT_SCHEDULE = "1f1b"                # the Plan's schedule when none is given

CATALOG: dict[str, ScheduleSpec] = {}    # name -> record, in registration order


def register_schedule(spec: ScheduleSpec) -> ScheduleSpec:
    """Add a schedule: the Plan, the CLI, the app, the simulator and the memory plan see it at once."""
    taken = set(CATALOG) | {a for s in CATALOG.values() for a in s.aliases}
    clash = sorted(({spec.name} | set(spec.aliases)) & taken)
    if clash:
        raise ValueError(f"schedule name {clash[0]!r} is taken: register under another name, or "
                         f"unregister_schedule({clash[0]!r}) first")
    CATALOG[spec.name] = spec
    return spec


def unregister_schedule(name: str) -> None:
    """Remove a registered schedule (a test's throwaway one); a Plan naming it is refused again."""
    if name not in CATALOG or name == DEFAULT_SCHEDULE:
        raise ValueError(f"no removable schedule {name!r}: pick one of "
                         f"{', '.join(n for n in CATALOG if n != DEFAULT_SCHEDULE)}")
    del CATALOG[name]


for _spec in BUILT_IN:
    register_schedule(_spec)


class ScheduleNames(Sequence):
    """The registered schedule names as a live sequence (with_aliases: their aliases after), so a
    field's choices, argparse help and the app's grammar see a schedule registered after import."""

    def __init__(self, with_aliases: bool = False):
        self.with_aliases = with_aliases

    def _names(self) -> tuple[str, ...]:
        names = tuple(CATALOG)
        return names + tuple(a for s in CATALOG.values() for a in s.aliases) if self.with_aliases else names

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(CATALOG) + (sum(len(s.aliases) for s in CATALOG.values()) if self.with_aliases else 0)

    def __repr__(self) -> str:
        return repr(self._names())


SCHEDULES = ScheduleNames()                      # the Plan's schedule choices
SCHEDULE_NAMES = ScheduleNames(with_aliases=True)  # what build_schedule takes


def schedule_spec(name: str) -> ScheduleSpec:
    """The record of a schedule name or alias (any case); ValueError naming the choices."""
    key = str(name).lower()
    for spec in CATALOG.values():
        if key == spec.name or key in spec.aliases:
            return spec
    raise ValueError(f"unknown schedule {name!r}: pick one of {', '.join(SCHEDULE_NAMES)}")


def specs(**wanted) -> list[ScheduleSpec]:
    """The records whose attributes equal `wanted` (specs(fb_overlap=True)), in catalogue order."""
    return [s for s in CATALOG.values() if all(getattr(s, k) == v for k, v in wanted.items())]


def least_microbatches(schedule: str, pp: int, local_batch: int | None = None) -> int:
    """The fewest microbatches `schedule` takes at pp pipeline ranks; with the per-rank batch, the
    fewest that also divide it (the least alone where none does): a Plan's microbatches=0."""
    spec = schedule_spec(schedule)
    if pp <= 1:
        return 1
    fits = [m for m in _divisors(local_batch or 0) if spec.takes(pp, m)]
    return fits[0] if fits else spec.least_count(pp)


def _divisors(n: int) -> list[int]:
    """n's divisors, ascending; sqrt(n) steps."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0] if n > 0 else []
    return small + [n // d for d in reversed(small) if d * d != n]


def build_schedule(name: str, pp: int, microbatches: int, virtual: int | None = None,
                   fb_overlap: bool = False) -> Schedule:
    """The schedule `name` (or an alias) at pp ranks: the record's rules first, in the words run and
    the app use, then its builder. fb_overlap: 1F1B's steady state as overlapped F&B pairs (the
    DualPipes have them already)."""
    spec = schedule_spec(name)
    if fb_overlap and not spec.fb_overlap:
        capable = [s.name for s in specs(fb_overlap=True)]
        raise ValueError(f"fb_overlap runs the overlapped F&B pairs of {', '.join(capable)}, not "
                         f"{name}: use schedule={' or '.join(capable)}, or drop fb_overlap")
    if not spec.virtual and virtual is not None and virtual != spec.chunks:
        raise ValueError(f"{name}: virtual_stages is for the interleaved schedule, got virtual_stages {virtual} "
                         f"({name} has {spec.chunks} chunk(s) per rank): drop virtual_stages")
    if isinstance(pp, int) and isinstance(microbatches, int) and pp >= 1 and microbatches >= 1:
        problem = spec.microbatch_problem(pp, microbatches)
        if problem:
            raise ValueError(f"{problem}: use microbatches={_next_taken(spec, pp, microbatches)}")
    schedule = spec.build(pp, microbatches, virtual, fb_overlap)
    schedule.name = spec.name        # a record reusing another's generator names its own schedule
    return schedule


def _next_taken(spec: ScheduleSpec, pp: int, microbatches: int) -> int:
    step = spec.multiple(pp)
    return max(spec.least_count(pp), -(-microbatches // step) * step)


def plan_schedule(plan) -> Schedule:
    """The schedule a Plan runs: the one Plan-to-schedule step, for the executor, the simulator,
    the report and whatif (virtual stages mean something to a virtual schedule only; fb_overlap pairs)."""
    virtual = plan.virtual_stages if schedule_spec(plan.schedule).virtual else None
    return build_schedule(plan.schedule, plan.pp, plan.microbatches, virtual, plan.fb_overlap)


def formula_bubble(name: str, pp: int, cost, virtual: int = 1) -> tuple[float, str]:
    """The published bubble for a schedule (largest over ranks for DualPipe/V), and its formula as text."""
    spec = schedule_spec(name)
    return spec.bubble(pp, cost, virtual), spec.bubble_text


def in_flight(schedule: str, pp: int, rank: int, microbatches: int, virtual: int = 1,
              fb_overlap: bool = False) -> int:
    """The most microbatch-chunk contexts a pp rank holds at once, by the schedule's record; with
    fb_overlap, by walking the paired schedule (a pair's forward holds its contexts before its
    backward frees the other's, and 1F1B's pairs run one forward further ahead)."""
    if pp == 1:
        return 1
    if fb_overlap:
        virtual = virtual if schedule_spec(schedule).virtual else None
        return build_schedule(schedule, pp, microbatches, virtual, True).held_contexts(rank)
    return schedule_spec(schedule).in_flight(pp, rank, microbatches, virtual)
