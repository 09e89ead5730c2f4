"""The emulated interconnect's model: alpha-beta links, the standard cost of each collective, and
the presets of real clusters scaled to this machine. Pure arithmetic (no torch), so the CLI checks a
`link=` spec before any process starts; kernels/comm/emulate.py holds ops to these times.

Costs (n ranks in the op's group, b the bytes each rank contributes, B the link's bandwidth, a its
latency), as in nccl-tests and the DeepSeek / Megatron papers:
    all_reduce (ring)                  2(n-1)/n * b/B + 2(n-1) a
    reduce_scatter, all_gather         (n-1)/n * b/B + (n-1) a      (b: the full, gathered buffer)
    all_to_all                         (n-1)/n * b/B + (n-1) a      (b: the rank's send buffer)
    broadcast (pipelined chain)        b/B + (n-1) a
    barrier                            (n-1) a
    send / recv                        b/B + a
A group whose ranks sit on one node uses the intra-node link, else the inter-node one (its slowest).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

# public dense bf16 FLOP/s and per-GPU, per-direction link bandwidths (../shared/REFERENCES.md);
# latencies are typical small-message figures (NVLink ~3 us, IB ~10 us), an assumption stated here
TARGETS = {
    "h800": {"flops": 989e12, "intra": (3.0, 160.0), "inter": (10.0, 50.0),
             "about": "H800 SXM as DeepSeek-V3 reports: NVLink 160 GB/s, IB 50 GB/s per GPU"},
    "h100": {"flops": 989e12, "intra": (3.0, 450.0), "inter": (10.0, 50.0),
             "about": "H100 SXM: NVLink 4 450 GB/s, IB 400 Gb/s = 50 GB/s per GPU"},
    "a100": {"flops": 312e12, "intra": (3.0, 300.0), "inter": (10.0, 25.0),
             "about": "A100 SXM: NVLink 3 300 GB/s, IB 200 Gb/s = 25 GB/s per GPU"},
}
FIELD_HELP = ("link=PRESET (h800, h100, a100) or link=alpha_us=A,gbps=B "
              "(latency in microseconds, bandwidth in gigabytes per second, this machine's time)")


@dataclass(frozen=True)
class LinkSpec:
    """One link: latency alpha_us (microseconds) and bandwidth gbps (gigabytes per second)."""
    alpha_us: float
    gbps: float

    def seconds(self, alphas: float, nbytes: float) -> float:
        return alphas * self.alpha_us * 1e-6 + nbytes / (self.gbps * 1e9)


@dataclass(frozen=True)
class LinkModel:
    """Links in this machine's own time: intra-node, inter-node, and how ranks sit on nodes.
    name/factor/cpu_flops say where it came from (a preset scaled by a calibration, or unscaled)."""
    intra: LinkSpec
    inter: LinkSpec
    ranks_per_node: int = 0          # 0: every rank on one node
    name: str = "custom"
    factor: float = 1.0              # the target's FLOP/s over this CPU's, per rank (1: unscaled)
    cpu_flops: float = 0.0           # the calibration: achieved FLOP/s per rank (0: none taken)
    target_flops: float = 0.0

    def node(self, rank: int) -> int:
        return rank // self.ranks_per_node if self.ranks_per_node else 0

    def spec_for(self, ranks) -> LinkSpec:
        return self.intra if len({self.node(r) for r in ranks}) <= 1 else self.inter

    def port(self, ranks) -> str:
        """The port class an op over `ranks` uses on each of them: "intra" or "inter"."""
        return "intra" if self.spec_for(ranks) is self.intra else "inter"

    def cost(self, op: str, ranks, nbytes: int) -> tuple[float, float]:
        """(latency seconds, transfer seconds) of one op over `ranks` moving `nbytes` as the comm
        layer records them (all_to_all: send + receive buffers; the rest: see the table above)."""
        return op_cost(op, len(ranks), nbytes, self.spec_for(ranks))

    def describe(self) -> str:
        where = f", {self.ranks_per_node} ranks per node" if self.ranks_per_node else ""
        head = (f"{self.name} scaled x{self.factor:.3g} (CPU {self.cpu_flops / 1e9:.2f} GFLOP/s "
                f"per rank vs {self.target_flops / 1e12:.0f} TFLOP/s)"
                if self.factor != 1.0 else self.name)
        return (f"{head}: intra {self.intra.alpha_us:.4g} us + {self.intra.gbps:.4g} GB/s, "
                f"inter {self.inter.alpha_us:.4g} us + {self.inter.gbps:.4g} GB/s{where}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LinkModel":
        """From to_dict's output, or a trace's metadata link (its extra keys, e.g. "describe",
        are left out)."""
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        d["intra"], d["inter"] = LinkSpec(**d["intra"]), LinkSpec(**d["inter"])
        return cls(**d)


def match_key(op: str, rank: int, peer: int | None, tag: int, group: str,
              members) -> tuple[tuple, str, tuple]:
    """How ops pair up across ranks on the link: (key, kind, ranks). A p2p op is keyed by (src,
    dst, tag), kind "send" or "recv"; a collective by (group, its members), kind "coll". The n-th
    op of a kind on one key pairs with the n-th of the peer (the caller counts n)."""
    if op in ("send", "recv"):
        src, dst = (rank, peer) if op == "send" else (peer, rank)
        return ("p2p", src, dst, tag), op, (src, dst)
    return ("coll", group, tuple(members)), "coll", tuple(members)


class Ports:
    """One rank's ports on the link, one per class ("intra", "inter"): the ends of ops still moving
    there. When is an op done: a collective starts at its last member's issue, a send at its own
    (eager); then latency, then its transfer on the port (share_port). A recv ends at its send's
    end, or at its own issue if that is later."""

    def __init__(self):
        self.moving: dict = {}

    def queue(self, port: str, start: float, latency: float, transfer: float) -> float:
        """The end of an op that starts at `start` on `port` (units: the caller's, all alike)."""
        end, self.moving[port] = share_port(self.moving.get(port, []), start + latency, transfer)
        return end


def share_port(moving: list, t0: float, transfer: float) -> tuple[float, list]:
    """An op whose transfer starts at t0 on a port where ops end at `moving`: it runs at 1/(k+1)
    of the bandwidth with k still moving (earlier ops keep their ends; a one-pass approximation of
    fair sharing). Returns (its end, the port's new list of ends)."""
    still = [e for e in moving if e > t0]
    end = t0 + transfer * (len(still) + 1)
    return end, still + [end]


def op_cost(op: str, n: int, nbytes: float, spec: LinkSpec) -> tuple[float, float]:
    """(latency seconds, transfer seconds) of `op` over n ranks; nbytes as the comm layer records."""
    if n <= 1:
        return 0.0, 0.0
    frac = (n - 1) / n
    if op == "all_reduce":
        alphas, b = 2 * (n - 1), 2 * frac * nbytes
    elif op in ("reduce_scatter", "all_gather"):
        alphas, b = n - 1, frac * nbytes
    elif op == "all_to_all":
        alphas, b = n - 1, frac * nbytes / 2           # recorded as send + receive buffers
    elif op == "broadcast":
        alphas, b = n - 1, nbytes
    elif op == "barrier":
        alphas, b = n - 1, 0
    elif op in ("send", "recv"):
        alphas, b = 1, nbytes
    else:
        raise ValueError(f"no link cost for op {op!r}")
    return spec.seconds(alphas, 0), spec.seconds(0, b)


def parse_link(text: str) -> tuple[str, LinkSpec | None]:
    """'h800' -> ('h800', None); 'alpha_us=5,gbps=2' -> ('custom', LinkSpec(5, 2)). One-line errors
    name the field and a valid form."""
    text = (text or "").strip().lower()
    if text in TARGETS:
        return text, None
    if "=" not in text:
        raise ValueError(f"link={text or '?'} is not a preset or a spec: pick {FIELD_HELP}")
    vals = {}
    for part in text.split(","):
        key, _, val = part.partition("=")
        key = key.strip()
        if key not in ("alpha_us", "gbps"):
            raise ValueError(f"link={text}: unknown key {key!r}; pick {FIELD_HELP}")
        try:
            vals[key] = float(val)
        except ValueError:
            raise ValueError(f"link={text}: {key}={val!r} is not a number; pick {FIELD_HELP}")
    if set(vals) != {"alpha_us", "gbps"}:
        raise ValueError(f"link={text} needs both alpha_us and gbps, e.g. link=alpha_us=50,gbps=0.5")
    if not all(map(math.isfinite, vals.values())) or vals["alpha_us"] < 0 or vals["gbps"] <= 0:
        raise ValueError(f"link={text}: alpha_us must be a finite number >= 0 and gbps a finite "
                         f"number > 0, e.g. "
                         f"link=alpha_us=50,gbps=0.5")
    return "custom", LinkSpec(vals["alpha_us"], vals["gbps"])


def check_link(text: str | None, ranks_per_node: int | None, world: int) -> None:
    """Validate link= and ranks_per_node= before launching anything."""
    if text is not None:
        parse_link(text)
    if ranks_per_node is not None:
        if text is None:
            raise ValueError(f"ranks_per_node={ranks_per_node} places ranks on nodes of an "
                             f"emulated link: add link=h800 (or another preset)")
        if ranks_per_node < 1 or world % ranks_per_node:
            raise ValueError(f"ranks_per_node={ranks_per_node} must be >= 1 and divide world "
                             f"{world}: pick a divisor of {world}")


def build_link(text: str, ranks_per_node: int | None = None, cpu_flops: float = 0.0) -> LinkModel:
    """The link model of a spec. A preset is scaled to this machine: both links are slowed by the
    factor the compute is (target FLOP/s / cpu_flops per rank), so comm/compute ratios match the
    target's; a custom alpha_us/gbps spec is taken as it is, for both links."""
    name, spec = parse_link(text)
    rpn = ranks_per_node or 0
    if spec is not None:
        return LinkModel(spec, spec, rpn, name=f"alpha_us={spec.alpha_us:g},gbps={spec.gbps:g}")
    t = TARGETS[name]
    if cpu_flops <= 0:
        raise ValueError(f"link={name} is scaled to this machine and needs a calibration "
                         f"(cpu_flops > 0)")
    f = t["flops"] / cpu_flops

    def scaled(alpha_us, gbps):
        return LinkSpec(alpha_us * f, gbps / f)
    return LinkModel(scaled(*t["intra"]), scaled(*t["inter"]), rpn, name=name, factor=f,
                     cpu_flops=cpu_flops, target_flops=t["flops"])
