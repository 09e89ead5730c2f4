"""What a rank shows: every parameter it holds (global shape, local shape, where its piece sits
in the global tensor), value / grad / optimizer-state summaries, its memory ledger. Plain data,
so the app draws it and scripts read it."""
from __future__ import annotations

import dataclasses

import torch

from kernels.ep.deepseek_layer import selection_biases

N_VALUES = 4


def summary(t: torch.Tensor | None) -> dict | None:
    if t is None:
        return None
    f = t.detach().float().reshape(-1)
    return {"norm": f.norm().item(), "mean": f.mean().item() if f.numel() else 0.0,
            "absmax": f.abs().max().item() if f.numel() else 0.0,
            "values": [round(v, 6) for v in f[:N_VALUES].tolist()], "numel": f.numel(),
            "dtype": str(t.dtype).replace("torch.", "")}


def rank_info(eng) -> dict:
    ctx = eng.ctx
    return {"rank": ctx.rank, "label": ctx.label, "coords": ctx.coords,
            "role": eng.runner.role() if hasattr(eng.runner, "role") else "",
            "n_params": sum(pc["tensor"].numel() for pc in eng.param_pieces()),
            "plan": eng.plan.to_dict(), "ledger": eng.sync.ledger(),
            "groups": {name: list(g.ranks) for name, g in ctx.groups.items()}}


def step_summary(res) -> dict:
    d = dataclasses.asdict(res)
    d.update(d.pop("extra"))
    return d


def step_item(eng, check: bool = False) -> dict:
    """Run one step; this rank's summary of it, with its ledger and, for --check, the pieces of its
    grads and of its params after the update."""
    item = step_summary(eng.step())
    item["ledger"] = eng.sync.ledger()
    if check:
        item["grad_pieces"] = eng.grad_pieces()
        item["param_pieces"] = eng.param_pieces()
    return item


def _piece(pc: dict, key: str, full: bool) -> dict:
    out = {"name": pc["name"], "global_shape": pc["global_shape"], "kind": pc["kind"],
           "index": pc["index"], "local_shape": list(pc[key].shape), key: summary(pc[key])}
    if full:
        out[key + "_full"] = pc[key].detach().float().tolist()
    return out


def take(eng, query: dict) -> dict:
    """A rank's snapshot. query["full"]: names whose whole tensors to include."""
    full = set(query.get("full", []))
    params = [_piece(pc, "tensor", pc["name"] in full) for pc in eng.param_pieces()]
    grads = {pc["name"]: _piece(pc, "tensor", pc["name"] in full) for pc in eng.grad_pieces()}
    optim = []
    for pc in eng.sync.optimizer_pieces():
        st = {k: summary(v) for k, v in pc["state"].items()}
        item = {"name": pc["name"], "kind": pc["kind"], "index": pc["index"],
                "global_shape": pc["global_shape"], "step": pc["step"], "state": st}
        if pc["name"] in full:
            item["state_full"] = {k: v.detach().float().tolist() for k, v in pc["state"].items()}
        optim.append(item)
    for p in params:
        g = grads.get(p["name"])
        p["grad"] = g["tensor"] if g else None
        # the gradient's own piece: ZeRO-2/3 keep a flat shard of it, or none at all
        p["grad_piece"] = ({"kind": g["kind"], "index": g["index"], "local_shape": g["local_shape"]}
                           if g else None)
        if g and "tensor_full" in g:
            p["grad_full"] = g["tensor_full"]
        p["value"] = p.pop("tensor")
        if "tensor_full" in p:
            p["value_full"] = p.pop("tensor_full")
    # state beside the params (DeepSeek's selection bias): no grad, no optimizer, whole on this rank
    state = [{"name": b["name"], "global_shape": b["global_shape"], "kind": "slice", "index": None,
              "local_shape": list(b["tensor"].shape), "value": summary(b["tensor"])}
             for b in selection_biases(eng.layers)]
    info = rank_info(eng)
    info.update({"step": eng.step_count, "params": params, "state": state, "optimizer": optim,
                 "optimizer_step": getattr(eng.optimizer, "step_count", 0),
                 "shard_map": eng.sync.shard_map() if hasattr(eng.sync, "shard_map") else None})
    return info
