"""One validated Plan holding every parallel dimension, rank coordinates on the grid, and one
process group per dimension.

Grid order, innermost first: tp, cp, dp, pp. Expert parallelism is carved out of dp: the ep
group is `ep` consecutive dp ranks; the ranks holding the same experts form `ep_dp`.
kernels.validate checks a Plan against a model before any process starts.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace


SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb1p", "dualpipe", "dualpipev")
FB_OVERLAP_SCHEDULES = ("1f1b", "dualpipe", "dualpipev")   # the schedules with F&B pairs (kernels.pp)
CP_MODES = ("ring", "zigzag", "ulysses")
DTYPES = ("fp32", "bf16")
COLLECTIVES = ("native", "hand")


class PlanError(ValueError):
    """An invalid plan; the message names the numbers and a fix."""


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
