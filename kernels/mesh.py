"""One validated Plan holding every parallel dimension, rank coordinates on the grid, and one
process group per dimension.

Grid order, innermost first: tp, cp, dp, pp. Expert parallelism is carved out of dp: the ep
group is `ep` consecutive dp ranks; the ranks holding the same experts form `ep_dp`.
Everything is checked before any process starts, each error naming the numbers and a fix.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from kernels.ep.families import routing_problem

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb1p", "dualpipe", "dualpipev")
FB_OVERLAP_SCHEDULES = ("1f1b", "dualpipe", "dualpipev")   # the schedules with F&B pairs (kernels.pp)
CP_MODES = ("ring", "zigzag", "ulysses")
DTYPES = ("fp32", "bf16")
COLLECTIVES = ("native", "hand")


class PlanError(ValueError):
    """An invalid plan; the message names the numbers and a fix."""


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


@dataclass(frozen=True)
class Plan:
    world: int = 0            # 0: dp * tp * cp * pp
    dp: int = 0               # 0: derived from world
    zero: int = 0
    tp: int = 1
    sp: bool = False
    pp: int = 1
    schedule: str = "1f1b"
    microbatches: int = 1
    virtual_stages: int = 1   # chunks per rank for interleaved 1F1B
    fb_overlap: bool = False  # PP x EP: F&B pairs interleave DeepSeek's parts so all-to-all hides (1f1b, dualpipe/v)
    cp: int = 1
    cp_mode: str = "ring"
    ep: int = 1
    experts: int = 0
    top_k: int = 2
    capacity_factor: float | None = None  # None: no capacity limit
    overlap: bool = False     # EP: two microbatches interleaved so all-to-all hides behind compute
    ep_dispatch: str = "uneven"  # EP all-to-all: uneven splits (counts first) or even (capacity-padded)
    # the MoE family and DeepSeek-V3 routing (kernels/ep/families.py); None: the model's own
    moe: str | None = None
    moe_hidden: int | None = None
    shared_experts: int | None = None
    route_scale: float | None = None
    route_groups: int | None = None
    route_topk_groups: int | None = None
    seq_aux_alpha: float | None = None
    balance: str | None = None
    bias_gamma: float | None = None
    bucket_mb: float = 4.0    # DP / ZeRO gradient bucket size
    grad_sync: str = "bucketed"  # DP: naive (all-reduce after backward) or bucketed (overlapped)
    dtype: str = "fp32"
    collectives: str = "native"

    # ---- derived sizes
    @property
    def stages(self) -> int:
        if self.pp == 1:
            return 1
        if self.schedule in ("dualpipev",):
            return 2 * self.pp
        if self.schedule == "interleaved":
            return self.pp * self.virtual_stages
        return self.pp

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def resolved(self, world: int | None = None) -> "Plan":
        """Fill world and dp from each other and validate the grid (not the model)."""
        other = self.tp * self.cp * self.pp
        for name in ("tp", "cp", "pp", "ep", "microbatches", "virtual_stages"):
            if getattr(self, name) < 1:
                raise PlanError(f"{name} = {getattr(self, name)} must be >= 1")
        world = world or self.world
        dp = self.dp
        if dp < 0:
            raise PlanError(f"dp = {dp} must be >= 1 (or 0 to derive it from the world size)")
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
        dims = [f"{k} {getattr(self, k)}" for k in ("dp", "tp", "cp", "pp", "ep")
                if getattr(self, k) > 1]
        extra = []
        if self.zero:
            extra.append(f"ZeRO-{self.zero}")
        if self.pp > 1:
            extra.append(self.schedule + (" fb-overlap" if self.fb_overlap else ""))
        if self.cp > 1:
            extra.append(self.cp_mode)
        if self.sp:
            extra.append("sp")
        return " · ".join([" × ".join(dims) or "single"] + extra)


def validate(plan: Plan, cfg, world: int | None = None) -> Plan:
    """The resolved plan, or PlanError naming the first problem and how to fix it."""
    plan = plan.resolved(world)

    def need(ok, msg):
        if not ok:
            raise PlanError(msg)

    need(plan.zero in (0, 1, 2, 3), f"unknown ZeRO stage {plan.zero}: pick 0, 1, 2 or 3")
    need(plan.zero == 0 or plan.dp > 1,
         f"ZeRO-{plan.zero} shards over data-parallel ranks but dp = {plan.dp}: set dp=2 (or more) "
         f"or zero=0")
    need(plan.bucket_mb > 0, f"bucket size {plan.bucket_mb} MB must be > 0: try bucket_mb=4")
    need(plan.grad_sync in ("naive", "bucketed"),
         f"unknown grad sync {plan.grad_sync!r}: pick naive or bucketed")
    need(plan.dtype in DTYPES, f"unknown dtype {plan.dtype!r}: pick {' or '.join(DTYPES)}")
    need(plan.collectives in COLLECTIVES,
         f"unknown collectives {plan.collectives!r}: pick native or hand")
    need(cfg.batch % plan.dp == 0,
         f"global batch {cfg.batch} is not divisible by dp {plan.dp}: pick batch a multiple of "
         f"{plan.dp} or dp in {_divisors(cfg.batch)}")
    local_batch = cfg.batch // plan.dp
    need(local_batch % plan.microbatches == 0,
         f"per-rank batch {local_batch} (batch {cfg.batch} / dp {plan.dp}) is not divisible by "
         f"{plan.microbatches} microbatches: pick microbatches in {_divisors(local_batch)}")
    # tensor parallel
    need(cfg.heads % plan.tp == 0,
         f"tp {plan.tp} does not divide {cfg.heads} heads: pick tp in {_divisors(cfg.heads)}")
    tp_ok = [d for d in range(1, cfg.heads + 1)
             if cfg.heads % d == 0 and (cfg.kv_heads % d == 0 or d % cfg.kv_heads == 0)]
    need(cfg.kv_heads % plan.tp == 0 or plan.tp % cfg.kv_heads == 0,
         f"tp {plan.tp} and {cfg.kv_heads} kv heads: tp must divide the kv heads (sharded) or be "
         f"a multiple of them (replicated); pick tp in {', '.join(map(str, tp_ok))}")
    need(cfg.vocab % plan.tp == 0,
         f"vocab {cfg.vocab} is not divisible by tp {plan.tp}: pick a vocab multiple of {plan.tp}")
    need(cfg.ffn_hidden % plan.tp == 0,
         f"MLP hidden {cfg.ffn_hidden} is not divisible by tp {plan.tp}")
    need(not plan.sp or plan.tp > 1, "sp (sequence parallel) needs tp=2 or more")
    need(not plan.sp or cfg.seq % plan.tp == 0,
         f"sequence parallel splits seq {cfg.seq} over tp {plan.tp}: pick seq a multiple of "
         f"{plan.tp}")
    need(not plan.sp or (cfg.seq // plan.cp) % plan.tp == 0,
         f"sequence parallel splits each cp rank's {cfg.seq // plan.cp} tokens (seq {cfg.seq} / "
         f"cp {plan.cp}) over tp {plan.tp}: pick seq a multiple of {plan.cp * plan.tp}")
    # pipeline parallel
    need(plan.schedule in SCHEDULES,
         f"unknown schedule {plan.schedule!r}: pick one of {', '.join(SCHEDULES)}")
    if plan.pp > 1:
        _validate_pipeline(plan, cfg, need)
    # context parallel
    need(plan.cp_mode in CP_MODES, f"unknown cp mode {plan.cp_mode!r}: pick one of "
                                   f"{', '.join(CP_MODES)}")
    if plan.cp > 1:
        pieces = 2 * plan.cp if plan.cp_mode == "zigzag" else plan.cp
        need(cfg.seq % pieces == 0,
             f"seq {cfg.seq} is not divisible by {pieces} ({'2 x ' if plan.cp_mode == 'zigzag' else ''}"
             f"cp {plan.cp}) for {plan.cp_mode}: pick seq a multiple of {pieces}")
        if plan.cp_mode == "ulysses":
            local_kv = cfg.kv_heads // plan.tp if cfg.kv_heads % plan.tp == 0 else 1  # per tp rank
            need(cfg.heads % (plan.cp * plan.tp) == 0 and local_kv % plan.cp == 0,
                 f"Ulysses splits heads over cp {plan.cp}: {cfg.heads} heads (/ tp {plan.tp}) and "
                 f"{local_kv} kv heads per tp rank must be divisible by cp; pick cp in "
                 f"{_divisors(local_kv)} or use cp_mode=ring")
    # expert parallel
    experts = plan.experts or cfg.experts
    need(not (plan.sp and experts),
         f"sp (sequence parallel) cannot run the {experts}-expert MoE layers on sequence shards "
         f"(a routing group is one whole sequence): drop sp or experts")
    need(plan.ep == 1 or experts > 0,
         f"ep {plan.ep} needs an MoE model: set experts={2 * plan.ep} (or another multiple of ep)")
    if experts:
        need(experts % plan.ep == 0,
             f"{experts} experts not divisible by ep {plan.ep}: pick ep in {_divisors(experts)}")
        need(plan.dp % plan.ep == 0,
             f"ep {plan.ep} must divide dp {plan.dp} (experts are sharded over data-parallel "
             f"ranks): pick ep in {_divisors(plan.dp)}")
        need(1 <= plan.top_k <= experts,
             f"top-k {plan.top_k} must be between 1 and the {experts} experts")
        need(plan.capacity_factor is None or plan.capacity_factor > 0,
             f"capacity factor {plan.capacity_factor} must be > 0 (leave it out for no limit)")
    problem = routing_problem(cfg)
    need(problem is None, problem)
    need(not plan.overlap or experts > 0, "overlap splits MoE all-to-all: it needs experts")
    need(not plan.fb_overlap or plan.pp > 1,
         "fb_overlap pairs a forward with a backward inside a pipeline: set pp=2 (or more); without a "
         "pipeline, overlap=True interleaves two microbatches")
    need(plan.ep_dispatch in ("uneven", "even"),
         f"unknown EP dispatch {plan.ep_dispatch!r}: pick uneven or even")
    need(not (experts and plan.cp > 1),
         f"MoE with context parallel (cp {plan.cp}) is not supported: drop cp or experts")
    if plan.overlap and plan.pp == 1:
        pieces = 2 if plan.microbatches == 1 else plan.microbatches
        need(pieces % 2 == 0 and local_batch % pieces == 0,
             f"overlap runs microbatches in pairs: per-rank batch {local_batch} (batch "
             f"{cfg.batch} / dp {plan.dp}) into {pieces} microbatches does not work; pick "
             f"microbatches even and dividing {local_batch}, or a per-rank batch of 2 or more")
    return plan


def _validate_pipeline(plan: Plan, cfg, need) -> None:
    p, m, s = plan.pp, plan.microbatches, plan.stages
    need(cfg.layers % s == 0,
         f"{cfg.layers} layers are not divisible by {s} pipeline stages ({plan.schedule}, pp {p}"
         f"{', virtual ' + str(plan.virtual_stages) if plan.schedule == 'interleaved' else ''}): "
         f"pick layers a multiple of {s}")
    if plan.schedule in ("dualpipe", "dualpipev"):
        need(p % 2 == 0 or plan.schedule == "dualpipev",
             f"DualPipe needs an even number of pipeline ranks, got pp {p}: pick pp={p + 1} or "
             f"pp={max(2, p - 1)}")
        need(m >= 2 * p and m % 2 == 0,
             f"{plan.schedule} needs an even number of microbatches >= 2 x pp = {2 * p}, got {m}: "
             f"use microbatches={max(2 * p, m + m % 2)}")
    elif plan.schedule == "interleaved":
        need(plan.virtual_stages >= 2, "interleaved 1F1B needs virtual_stages 2 or more")
        need(m % p == 0 and m >= p,
             f"interleaved 1F1B needs microbatches a multiple of pp {p}, got {m}: use "
             f"microbatches={p * max(1, -(-m // p))}")
    elif plan.schedule in ("1f1b", "zb1p"):
        need(m >= p, f"{plan.schedule} needs at least pp = {p} microbatches, got {m}: use "
                     f"microbatches={p}")
    need(plan.zero < 3 or plan.schedule not in ("zb1p", "dualpipe", "dualpipev"),
         f"ZeRO-3 frees a layer's gathered weights after its backward, but {plan.schedule} defers "
         f"the weight grads (W) past it: use zero=2 with {plan.schedule}, or a schedule without "
         f"split W (gpipe, 1f1b, interleaved) with zero=3")
    need(plan.schedule == "interleaved" or plan.virtual_stages == 1,
         f"virtual_stages is for the interleaved schedule, not {plan.schedule}")
    if plan.fb_overlap:
        need(plan.schedule in FB_OVERLAP_SCHEDULES,
             f"fb_overlap interleaves the F&B pairs of {', '.join(FB_OVERLAP_SCHEDULES)}, not {plan.schedule}: "
             f"use schedule=1f1b (or dualpipe, dualpipev), or drop fb_overlap")
        need(plan.experts or cfg.experts,
             "fb_overlap hides the MoE all-to-all behind the other microbatch: it needs experts (set experts=4 "
             "and ep=2), or drop fb_overlap")
        need(plan.zero < 3, f"ZeRO-3 gathers one layer's weights at a time, but fb_overlap runs two layers' "
                            f"parts interleaved: use zero=2 with fb_overlap")


# ---------------------------------------------------------------- coordinates and groups

DIMS = ("tp", "cp", "dp", "pp")  # innermost first


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
    parts = [f"{d}{c[d]}" for d in ("dp", "tp", "cp", "pp") if getattr(plan, d) > 1]
    if plan.ep > 1:
        parts.append(f"ep{c['ep']}")
    return " ".join(parts) or "single"


def partition(plan: Plan, dim: str) -> list[list[int]]:
    """Rank lists of every group along `dim` (tp, cp, dp, pp, ep, ep_dp, cp_dp)."""
    world = plan.world
    groups: dict[tuple, list[int]] = {}
    for r in range(world):
        c = coords(plan, r)
        if dim in DIMS:
            key = tuple(c[d] for d in DIMS if d != dim)
        elif dim == "ep":      # ep consecutive dp ranks
            key = (c["tp"], c["cp"], c["pp"], c["dp"] // plan.ep)
        elif dim == "ep_dp":   # dp ranks holding the same experts
            key = (c["tp"], c["cp"], c["pp"], c["dp"] % plan.ep)
        elif dim == "cp_dp":   # every rank with the same tp and pp: replicas of one param shard
            key = (c["tp"], c["pp"])
        else:
            raise ValueError(f"unknown dimension {dim!r}")
        groups.setdefault(key, []).append(r)
    return [groups[k] for k in sorted(groups)]
