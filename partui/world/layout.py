"""A plan's layout on paper: every global rank's coordinates, groups, stages, shards, experts and
memory ledger, before anything launches (`partui plan`, the app's Mesh tab).

Each rank's engine is built in this process as that rank (kernels.comm.dry_rank: groups without
process groups, no op run), so the layout is the one the world will build, read from the same code:
the tests launch the world and compare.
"""
from __future__ import annotations

from kernels import comm
from kernels.dp.sync import piece_index
from kernels.engine import Engine
from kernels.memory_plan import predict_rank
from partui.world.snapshot import rank_info
from partui.world.tables import piece_label
from planning.memory_estimate import estimate_rank
from planning.mesh import NAMED_DIMS, Plan, coords

LEDGER = ("params", "grads", "optimizer", "total")


def experts_held(eng, n_experts: int) -> list[int]:
    """The experts whose weights this rank holds (stacked over dim 0; EP shards dim 0)."""
    held: set[int] = set()
    for name, p in eng.params.items():
        if ".experts." in name:
            idx = piece_index(p)
            a, b = (0, n_experts) if idx is None else idx[0]
            held.update(range(a, b))
    return sorted(held)


def rank_layout(plan: Plan, cfg, rank: int, seed: int = 0) -> dict:
    """One rank as the world will build it (partui.world.snapshot.rank_info, plus groups and shards)."""
    with comm.dry_rank(rank, plan.world):
        eng = Engine(plan, cfg, rank=rank, seed=seed)
        info = rank_info(eng)
        shards = [{"name": n, "global_shape": list(p.global_shape), "local_shape": list(p.data.shape),
                   "index": piece_index(p)} for n, p in eng.params.items()]
        info.update(experts=experts_held(eng, cfg.experts), shards=shards,
                    predicted=predict_rank(eng), estimated=estimate_rank(plan, cfg, coords(plan, rank)["pp"]))
    del info["plan"]
    return info


def plan_layout(plan: Plan, cfg, seed: int = 0) -> list[dict]:
    """Every global rank's layout, in rank order."""
    return [rank_layout(plan, cfg, r, seed) for r in range(plan.world)]


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f}"


def layout_rows(plan: Plan, ranks: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, a row per rank): coordinates, the groups of the plan's dims, experts, memory."""
    dims = [d for d in NAMED_DIMS if getattr(plan, d) > 1]   # ep_dp, cp_dp ride in "all"
    head = ["rank", "coords"] + [f"{d} group" for d in dims] + ["experts", "params"] + \
        [f"{k} MiB" for k in LEDGER]
    rows = []
    for r in ranks:
        ex = r["experts"]
        rows.append([str(r["rank"]), r["label"]] + [",".join(map(str, r["groups"][d])) for d in dims]
                    + [f"{ex[0]}-{ex[-1]}" if ex else "—", str(r["n_params"])]
                    + [mib(r["ledger"][k]) for k in LEDGER])
    return head, rows


PREDICTED = ("params", "grads", "optimizer", "gathered", "activations", "peak")


def memory_text(ranks: list[dict], measured: list[dict] | None = None) -> str:
    """Each rank's predicted memory (kernels/memory_plan.py) in MiB, and beside it, given a
    trace's `report --memory` rows, the measured peak and activations."""
    head = ["rank"] + [f"{k} MiB" for k in PREDICTED] + ["in-flight mb", "estimate MiB"]
    if measured:
        head += ["measured peak MiB", "measured activations MiB"]
    rows = []
    for r in ranks:
        pred = r["predicted"]
        row = [str(r["rank"])] + ["—" if pred[k] is None else mib(pred[k]) + (
            "≈" if k == "activations" and pred.get("balanced_routing") else "") for k in PREDICTED]
        est = r["estimated"]
        row += [str(pred["activation_microbatches"]), mib(est["peak"]) + ("~" if est["approximate"] else "")]
        if measured:
            m = measured[r["rank"]]
            row += [f"{m['peak_mib']:.2f}", f"{m['activations_mib']:.2f}"]
        rows.append(row)
    widths = [max(len(x[i]) for x in [head] + rows) for i in range(len(head))]
    out = ["memory predicted per rank (params, grads, optimizer: the ZeRO split; gathered: ZeRO-3's "
           "two largest layers; activations: the schedule's in-flight microbatches x a chunk's "
           "saved bytes, an upper bound where a rank's chunks differ; — : not predicted (tp, cp, "
           "MoE under selective recompute); ≈ : MoE layers under an uneven dispatch, at balanced "
           "routing (a rank's experts receive as many rows as it sends; each row more or fewer "
           "moves it by that row's bytes); estimate: the peak estimated from the sizes alone before anything is built "
           "(planning/memory_estimate.py, AdamW's state), ~ where its activations are a "
           "dense-equivalent)" + ("; measured: the trace's memory account, which also holds the optimizer's "
                      "scratch and p2p buffers" if measured else "")]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head] + rows]
    return "\n".join(out)


def layout_text(plan: Plan, cfg, ranks: list[dict]) -> str:
    """The table `partui plan` prints: a line per rank, then each rank's role and shards."""
    head, rows = layout_rows(plan, ranks)
    widths = [max(len(x[i]) for x in [head] + rows) for i in range(len(head))]
    out = [f"{plan.describe()} · world {plan.world} · {cfg.layers} layers · "
           f"{cfg.n_params()} params (memory: bytes of params, grads, optimizer state per rank)"]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head] + rows]
    for r in ranks:
        out.append(f"\nrank {r['rank']} ({r['label']}): {r['role']}")
        for s in r["shards"]:
            piece = piece_label("slice", s["index"], s["global_shape"])
            out.append(f"  {s['name']:<34} {str(s['global_shape']):<14} {piece}")
    return "\n".join(out)
