"""What the checkpoint tests share: the plans, a bounded World, and a checkpoint's whole state
through DCP's own converter (dcp_to_torch_save), compared with torch.equal."""
from __future__ import annotations

import os

import torch

from kernels.comm.dcp import flat as flat_of
from kernels.comm import dcp
from partui import World

TIMEOUT_S = 120.0     # a silent rank fails the command (the world's deadline), never hangs a test

# name -> (model, Plan fields); grouped by model: a checkpoint resumes only its own model
DENSE = {
    "dp2": {"dp": 2},
    "zero1": {"dp": 2, "zero": 1},
    "zero2": {"dp": 2, "zero": 2},
    "zero3": {"dp": 2, "zero": 3},
    "tp2sp": {"tp": 2, "sp": True},
    "pp1f1b": {"pp": 2, "schedule": "1f1b"},
    "interleaved": {"pp": 2, "schedule": "interleaved", "virtual_stages": 2},
    "dualpipe": {"pp": 2, "schedule": "dualpipe"},
    "dualpipev": {"pp": 2, "schedule": "dualpipev"},
    "cp2": {"cp": 2},
    "mesh3d": {"dp": 2, "tp": 2, "pp": 2, "zero": 1},
}
GSHARD = {
    "ep2": {"experts": 4, "ep": 2},
    "ep2_dp1": {"experts": 4},
    "ep2_zero3": {"experts": 4, "dp": 2, "zero": 3},
}
DEEPSEEK = {
    "ds_ep2": {"ep": 2},
    "ds_zero2": {"dp": 2, "zero": 2},
    "ds_pp2": {"pp": 2, "schedule": "1f1b"},
}
MIXED = {"zero2_bf16": {"dp": 2, "zero": 2, "dtype": "bf16"}}   # bf16 params, fp32 masters
MODEL_OF = {**{k: "tiny" for k in (*DENSE, *GSHARD, *MIXED)},
            **{k: "deepseek-tiny" for k in DEEPSEEK}}
FIELDS = {**DENSE, **GSHARD, **DEEPSEEK, **MIXED}


def world(name: str, check: bool = False) -> World:
    w = World(timeout_s=TIMEOUT_S, check=check)
    w.plan("custom", MODEL_OF[name], **FIELDS[name])
    w.launch()
    return w


def whole_state(ckpt: str, out_dir: str, keep_rng: bool = False) -> dict[str, torch.Tensor]:
    """The checkpoint through dcp_to_torch_save, fqn -> tensor (RNG states left out unless asked:
    they are per rank, so a reshard to another world size has others)."""
    out = os.path.join(out_dir, os.path.basename(ckpt.rstrip("/")) + ".pt")
    dcp.to_torch_save(ckpt, out)
    sd = flat_of(torch.load(out, weights_only=True))
    return {k: v for k, v in sd.items() if keep_rng or not k.startswith("rng.")}


def differences(a: dict, b: dict) -> list[str]:
    """Names whose tensors are not bitwise equal (or are in one only)."""
    bad = sorted(set(a) ^ set(b))
    bad += [k for k in sorted(set(a) & set(b))
            if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not torch.equal(a[k], b[k])]
    return bad
