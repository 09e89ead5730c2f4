"""One Plan holding every parallel dimension, rank coordinates on the grid, and one process group
per dimension.

The Plan describes itself: each field's metadata (planning.field_spec.plan_field) holds its kind,
choices or range, help text and the dimension it belongs to. The CLI flags, the app's command-line
grammar, the setup form and the field-to-flag table are generated from it (field_specs), so a new
field is added here and nowhere else. A Plan is checked field by field when it is built; the checks
that need the model (and suggest verified fixes) are planning.validate's, run once where the plan meets
its model (planning.validate.plan_for_model).

The fields are grouped by concern, as torchtitan separates its config: ParallelFields,
ModelFields, TrainingFields and ObservationFields, each a frozen dataclass naming its SECTION,
combined into Plan by inheritance (`plan.pp` reads as ever; each FieldSpec carries its section, and
`partui run --help` prints a flag group per section).

Grid order, innermost first: tp, cp, dp, pp (each grid field's metadata "grid"). Expert parallelism
is carved out of dp: the ep group is `ep` consecutive dp ranks; the ranks holding the same experts
form `ep_dp`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from planning.field_spec import FieldSpec, PlanError, fix_text, plan_field, specs_of
from planning.moe_families import BALANCE_MODES, MOE_FAMILIES
from planning.pipeline.catalog import DEFAULT_SCHEDULE, SCHEDULES, schedule_spec

CP_MODES = ("ring", "zigzag", "ulysses")
DTYPES = ("fp32", "bf16")
COLLECTIVES = ("native", "hand")
MODELS_OWN = "the model's"   # the default of the MoE family fields: None, the model preset's own


# upper bounds of the sizes (plan_field le=): far past any CPU world, and a number typed into the
# app or the CLI is refused at once instead of sized against the model
MAX_DIM = 1024        # tp, cp, pp, ep: ranks of one dimension
MAX_RANKS = 65536     # world, dp
MAX_COUNT = 65536     # microbatches, experts, virtual stages, top-k


def field_specs(cls=None) -> tuple[FieldSpec, ...]:
    """The description of every field of a Plan class (default: Plan), in field order: what the
    flags, the app's command line and its setup form are generated from."""
    return specs_of(cls or Plan)


@dataclass(frozen=True)
class ParallelFields:
    """The parallel dimensions and how each runs: DP and ZeRO, TP, CP, PP (the schedule), EP."""
    SECTION = "parallelism"   # the flags' group in `partui run --help` (FieldSpec.section)
    world: int = plan_field(0, "ranks, >= 1 (default: the product of the dims)", ge=0,
                            le=MAX_RANKS, label="world")
    # ---- data parallel
    dp: int = plan_field(0, "data-parallel ranks, >= 1 (default: derived from --world)", dim="dp",
                         ge=0, le=MAX_RANKS, form=1, grid=2)
    zero: int = plan_field(0, "ZeRO stage: 1 shards optimizer state, 2 also grads, 3 also params "
                              "(needs --dp 2+)", dim="dp", choices=(0, 1, 2, 3),
                           label="ZeRO stage", form=6)
    grad_sync: str = plan_field("bucketed", "DP grad sync: one all-reduce after backward, or "
                                            "buckets overlapped with backward", kind=str, dim="dp",
                                choices=("naive", "bucketed"), label="grad sync")
    bucket_mb: float = plan_field(4.0, "DP / ZeRO gradient bucket size, > 0", kind=float, dim="dp",
                                  gt=0, label="bucket size")
    # ---- tensor parallel
    tp: int = plan_field(1, "tensor-parallel ranks; divides heads and kv heads", dim="tp", ge=1,
                         le=MAX_DIM, form=2, grid=0)
    sp: bool = plan_field(False, "sequence parallel (with --tp)", kind=bool, dim="tp", form=11)
    # ---- context parallel
    cp: int = plan_field(1, "context-parallel ranks; divides the sequence", dim="cp", ge=1,
                         le=MAX_DIM, form=4, grid=1)
    cp_mode: str = plan_field("ring", "context-parallel attention: ring, zigzag (balanced causal "
                                      "ring) or Ulysses", kind=str, dim="cp", choices=CP_MODES,
                              label="cp mode", form=10)
    # ---- pipeline parallel
    pp: int = plan_field(1, "pipeline ranks; stages divide the layers", dim="pp", ge=1, le=MAX_DIM,
                         form=3, grid=3)
    schedule: str = plan_field(DEFAULT_SCHEDULE, "pipeline schedule (planning/pipeline/catalog.py)",
                               kind=str, dim="pp", choices=SCHEDULES, form=9)
    microbatches: int = plan_field(0, "microbatches per step; divides the per-rank batch (default "
                                      "0: the least the schedule takes that divides it)",
                                   dim="pp", ge=0, le=MAX_COUNT, form=7)
    virtual_stages: int = plan_field(1, "chunks per rank of a virtual-stage schedule (interleaved), "
                                        ">= 2 (default: the schedule's own, 2)", dim="pp", ge=1,
                                     le=MAX_COUNT)
    fb_overlap: bool = plan_field(False, "PP x EP: each F&B pair of a schedule that has them "
                                         "interleaves the forward's and the backward's attention / "
                                         "expert parts so every all-to-all flies under the other "
                                         "microbatch", kind=bool, dim="pp", form=12)
    # ---- expert parallel (carved out of dp)
    ep: int = plan_field(1, "expert-parallel ranks (carved out of --dp); divides --experts",
                         dim="ep", ge=1, le=MAX_DIM, form=5)
    overlap: bool = plan_field(False, "EP: overlap all-to-all with compute (two microbatches "
                                      "interleaved)", kind=bool, dim="ep")
    ep_dispatch: str = plan_field("uneven", "EP all-to-all: uneven splits (counts exchanged first) "
                                            "or capacity-padded", kind=str, dim="ep",
                                  choices=("uneven", "even"), label="EP dispatch")


@dataclass(frozen=True)
class ModelFields(ParallelFields):
    """The model's MoE layers and routing (None: the model preset's own)."""
    SECTION = "model / MoE"   # the flags' group in `partui run --help` (FieldSpec.section)
    experts: int = plan_field(0, "experts per MoE layer (0: dense MLP)", dim="ep", ge=0, le=MAX_COUNT,
                              form=8)
    top_k: int = plan_field(2, "experts per token, 1..--experts", dim="ep", ge=1, le=MAX_COUNT,
                          label="top-k", form=13)
    capacity_factor: float | None = plan_field(None, "expert capacity, > 0 (default: no limit)",
                                               kind=float, dim="ep", gt=0, label="capacity factor")
    # the MoE family and DeepSeek-V3 routing (planning/moe_families.py); None: the model's own
    moe: str | None = plan_field(None, f"MoE family: gshard (softmax, capacity, aux loss) or "
                                       f"deepseek (sigmoid, bias, shared experts) (default "
                                       f"{MODELS_OWN})", kind=str, dim="ep", choices=MOE_FAMILIES)
    moe_hidden: int | None = plan_field(None, f"each routed expert's hidden size; fine-grained "
                                              f"experts are narrow (default {MODELS_OWN})",
                                        dim="ep", ge=0)
    shared_experts: int | None = plan_field(None, f"deepseek: always-applied experts beside the "
                                                  f"routed ones (default {MODELS_OWN})", dim="ep",
                                            ge=0)
    route_scale: float | None = plan_field(None, f"deepseek: gate values (normalised to sum 1) "
                                                 f"times this (default {MODELS_OWN})", kind=float,
                                           dim="ep", gt=0)
    route_groups: int | None = plan_field(None, f"deepseek: experts in G groups, G dividing "
                                                f"--experts (default {MODELS_OWN})", dim="ep", ge=1)
    route_topk_groups: int | None = plan_field(None, f"deepseek: each token routes inside its best "
                                                     f"M of the groups, 1 <= M <= G (default "
                                                     f"{MODELS_OWN})", dim="ep", ge=1)
    seq_aux_alpha: float | None = plan_field(None, f"deepseek: sequence-wise balance loss weight "
                                                   f"alpha (default {MODELS_OWN})", kind=float,
                                             dim="ep", ge=0)
    balance: str | None = plan_field(None, f"deepseek: bias = auxiliary-loss-free balancing of the "
                                           f"selection bias (default {MODELS_OWN})", kind=str,
                                     dim="ep", choices=BALANCE_MODES)
    bias_gamma: float | None = plan_field(None, f"deepseek: bias update per step, +-gamma by load "
                                                f"(default {MODELS_OWN})", kind=float, dim="ep",
                                          ge=0)


@dataclass(frozen=True)
class TrainingFields(ModelFields):
    """How every rank computes: dtype, collectives, activation recompute."""
    SECTION = "training"   # the flags' group in `partui run --help` (FieldSpec.section)
    dtype: str = plan_field("fp32", "parameter and compute dtype", kind=str, choices=DTYPES, form=14)
    collectives: str = plan_field("native", "native gloo collectives, or the hand-written ring / "
                                            "chain / pairwise ones", kind=str, choices=COLLECTIVES)
    recompute: str = plan_field("none", "activation recompute: full keeps only each block's "
                                        "input and runs its forward again before its backward; "
                                        "selective keeps the matmul outputs and recomputes the "
                                        "norms, the softmax and SwiGLU's activation",
                                kind=str, choices=("none", "selective", "full"))


@dataclass(frozen=True)
class ObservationFields(TrainingFields):
    """Stragglers on purpose, to watch the blame and the timeline find them."""
    SECTION = "observation"   # the flags' group in `partui run --help` (FieldSpec.section)
    slow_rank: str = plan_field("", "a straggler on purpose: R=F runs rank R's compute F times as "
                                    "long (real work after each compute, recorded as compute)",
                                kind=str, label="slow rank")
    slow_stage: str = plan_field("", "a straggler on purpose: S=F runs pipeline stage S's compute "
                                     "F times as long", kind=str, dim="pp", label="slow stage")


@dataclass(frozen=True)
class Plan(ObservationFields):
    """One plan: the fields of every section (ParallelFields, ModelFields, TrainingFields,
    ObservationFields, in that order), read flat (`plan.pp`), refused field by field when built."""

    def __post_init__(self):
        """Refuse a value a field does not take (its kind, choices, range), naming a fix."""
        for spec in specs_of(type(self)):
            found = spec.problem(getattr(self, spec.name))
            if found:
                problem, candidates = found
                raise PlanError(f"{problem}: {fix_text(candidates)}" if candidates else problem,
                                field=spec.name, problem=problem, candidates=candidates)
        if not self.microbatches and self.pp == 1:   # no pipeline: the least is 1 whatever the batch
            object.__setattr__(self, "microbatches", 1)

    # ---- derived sizes
    @property
    def stages(self) -> int:
        return 1 if self.pp == 1 else schedule_spec(self.schedule).stages(self.pp, self.virtual_stages)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def resolved(self, world: int | None = None) -> "Plan":
        """Fill world and dp from each other and validate the grid (not the model)."""
        other = self.tp * self.cp * self.pp
        world = world or self.world
        dp = self.dp
        if not dp:
            if not world:
                dp = self.ep  # expert parallelism is carved out of dp: at least ep replicas
            elif world % other:
                raise PlanError(f"world {world} is not divisible by tp {self.tp} x cp {self.cp} x "
                                f"pp {self.pp} = {other}: pick dims whose product divides {world}")
            else:
                dp = world // other
        total = dp * other
        if world and world != total:
            raise PlanError(f"world {world} is not the product of the dims: dp {dp} x tp {self.tp} "
                            f"x cp {self.cp} x pp {self.pp} = {total}; set world={total} or "
                            f"change the dims")
        return replace(self, dp=dp, world=total)

    def describe(self) -> str:
        dims = [f"{k} {getattr(self, k)}" for k in NAMED_DIMS if getattr(self, k) > 1]
        extra = []
        if self.zero:
            extra.append(f"ZeRO-{self.zero}")
        if self.pp > 1:
            extra.append(self.schedule + (" fb-overlap" if self.fb_overlap else ""))
        if self.cp > 1:
            extra.append(self.cp_mode)
        if self.sp:
            extra.append("sp")
        if self.experts:   # GShard and DeepSeek-V3 plans of one mesh read apart
            extra.append(f"{self.experts} experts {self.moe or 'gshard'}")
        return " · ".join([" × ".join(dims) or "single"] + extra)


# ---------------------------------------------------------------- dimensions and groups
# The one list of dimensions, read off the Plan's fields: the grid (the four whose coordinates make
# the rank number, innermost first), the order they are named in (labels, describe: field order,
# ep last), and every process group a rank holds.
_GRID_FIELDS = [s for s in field_specs(Plan) if s.grid is not None]
DIMS = tuple(s.name for s in sorted(_GRID_FIELDS, key=lambda s: s.grid))   # tp, cp, dp, pp
GRID = tuple(s.name for s in _GRID_FIELDS)                                  # dp, tp, cp, pp
NAMED_DIMS = GRID + ("ep",)
# ep: ep consecutive dp ranks; ep_dp: the dp ranks holding the same experts; cp_dp: the replicas
# of one param shard; pp_mirror: the pp ranks holding the same stages (DualPipe's r and P-1-r)
GROUPS = DIMS + ("ep", "ep_dp", "cp_dp", "pp_mirror")


def groups_of(plan: Plan) -> tuple[str, ...]:
    """The groups of GROUPS a plan's ranks hold (pp_mirror: only DualPipe's, whose two directions
    put the same stages on ranks r and P-1-r)."""
    mirrored = plan.pp > 1 and schedule_spec(plan.schedule).mirrored
    return tuple(g for g in GROUPS if g != "pp_mirror" or mirrored)


def coords(plan: Plan, rank: int) -> dict[str, int]:
    """Grid coordinates of a global rank, plus ep (index inside its ep group)."""
    out, r = {}, rank
    for d in DIMS:
        n = getattr(plan, d)
        out[d] = r % n
        r //= n
    out["ep"] = out["dp"] % plan.ep
    return out


def rank_of(plan: Plan, c: dict[str, int]) -> int:
    r = 0
    for d in reversed(DIMS):
        r = r * getattr(plan, d) + c[d]
    return r


def coord_label(plan: Plan, rank: int) -> str:
    c = coords(plan, rank)
    parts = [f"{d}{c[d]}" for d in NAMED_DIMS if getattr(plan, d) > 1]
    return " ".join(parts) or "single"


def partition(plan: Plan, dim: str) -> list[list[int]]:
    """Rank lists of every group along `dim` (one of GROUPS)."""
    groups: dict[tuple, list[int]] = {}
    for r in range(plan.world):
        c = coords(plan, r)
        if dim in DIMS:
            key = tuple(c[d] for d in DIMS if d != dim)
        elif dim == "ep":      # ep consecutive dp ranks
            key = (c["tp"], c["cp"], c["pp"], c["dp"] // plan.ep)
        elif dim == "ep_dp":   # dp ranks holding the same experts
            key = (c["tp"], c["cp"], c["pp"], c["dp"] % plan.ep)
        elif dim == "cp_dp":   # every rank with the same tp and pp: replicas of one param shard
            key = (c["tp"], c["pp"])
        elif dim == "pp_mirror":  # DualPipe: pp ranks r and P-1-r hold the same stages
            mirrored = schedule_spec(plan.schedule).mirrored
            key = (c["tp"], c["cp"], c["dp"], min(c["pp"], plan.pp - 1 - c["pp"]) if mirrored
                   else c["pp"])
        else:
            raise ValueError(f"unknown dimension {dim!r}: pick one of {', '.join(GROUPS)}")
        groups.setdefault(key, []).append(r)
    return [groups[k] for k in sorted(groups)]
