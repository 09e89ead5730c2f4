"""`partui bench step`: world-1 step time of the hand-written path against the same model under
torch autograd with torch.optim.AdamW (target: hand no slower than 1.1x)."""
from __future__ import annotations

import argparse

import torch

from kernels.data import global_batch
from kernels.engine import Engine
from kernels.model import build_model
from partui.bench.args import model_names, whole_at_least_one
from partui.bench.harness import interleaved, print_rows
from partui.world.plans import build_plan


def _autograd_peer(cfg, seed):
    """Our forward under torch autograd, with torch's own AdamW: the peer step."""
    model = build_model(cfg, seed)
    prms = list(model.params().values())
    for p in prms:
        p.data = p.data.detach().requires_grad_(True)
    opt = torch.optim.AdamW([p.data for p in prms], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)
    state = {"step": 0}
    denom = cfg.batch * cfg.seq

    def step():
        ids, targets = global_batch(cfg.batch, cfg.seq, cfg.vocab, seed, state["step"])
        x = ids
        for layer in model.layers[:-1]:
            x, _ = layer.forward(x)
        loss, _ = model.layers[-1].forward(x, targets, denom)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        state["step"] += 1
    return step


def main(argv) -> int:
    ap = argparse.ArgumentParser(prog="partui bench step", description=__doc__)
    ap.add_argument("--models", type=model_names, default="tiny,small,medium",
                    help="model presets, comma-separated")
    ap.add_argument("--rounds", type=whole_at_least_one("--rounds", 15), default=15, help="interleaved rounds, >= 1")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for name in args.models:
        plan, cfg = build_plan("single", name)
        eng = Engine(plan, cfg)
        t = interleaved({"hand": eng.step, "autograd": _autograd_peer(cfg, 0)}, args.rounds)
        rows.append({"model": name, "params": cfg.n_params(), "hand_ms": t["hand"],
                     "autograd_adamw_ms": t["autograd"], "ratio": t["hand"] / t["autograd"]})
    print_rows(rows, ["model", "params", "hand_ms", "autograd_adamw_ms", "ratio"],
               "world-1 step, hand-written backward + hand AdamW vs torch autograd + "
               "torch.optim.AdamW (medians, interleaved; target ratio <= 1.1)", args.json)
    return 0
