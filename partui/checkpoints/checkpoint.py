"""The controller's side of a checkpoint: where it lives, when it counts, and what is refused.

A save root holds one folder per saved step, `step-00000012/`: DCP's rank files and `.metadata`
(kernels/comm/dcp.py) and `partui.json`, the manifest (the plan and model that wrote it, the
training options, the step, the data position, every file with its size). The ranks write into
`.partial-<pid>-<n>/` beside them; the folder is renamed into place only after every rank has
finished and the manifest is on disk, so a save killed half-way leaves the last good checkpoint
as it was (a partial folder is never read). `--keep K` then drops the oldest beyond K.

`check_resume` refuses, before any step runs, each way a checkpoint cannot resume a plan: a folder
that is not one, a missing or truncated rank file, a different model or vocabulary, a different
dtype, optimizer or seed, a missing tensor. Each refusal is one line (CheckpointError, a
ValueError) naming the difference and a fix. The model checks are torch-free; only the tensor
index (DCP's `.metadata`) needs torch.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import shutil

from planning.config import model_config_for, param_shapes

MANIFEST = "partui.json"
FORMAT = "partui-dcp-1"
STEP_DIR = re.compile(r"^step-(\d{8})$")
_serial = itertools.count()


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or resumed: one line naming the problem and a fix."""


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def is_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MANIFEST))


def saved_steps(root: str) -> list[str]:
    """The committed checkpoints under a save root, oldest first."""
    if not os.path.isdir(root):
        return []
    names = sorted(n for n in os.listdir(root) if STEP_DIR.match(n))
    return [os.path.join(root, n) for n in names if is_checkpoint(os.path.join(root, n))]


def resolve(path: str) -> str:
    """A checkpoint folder, or a save root (its latest checkpoint); CheckpointError otherwise."""
    if is_checkpoint(path):
        return path
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: no such folder: pick a folder written by --save "
                              f"(partui run ... --save ckpt/)")
    found = saved_steps(path)
    if found:
        return found[-1]
    what = "a DCP folder without partui's manifest" if os.path.isfile(
        os.path.join(path, ".metadata")) else "not a checkpoint"
    raise CheckpointError(f"{path}: {what} (no {MANIFEST}, no step-NNNNNNNN/ inside): pick a "
                          f"folder written by --save (partui run ... --save ckpt/)")


def read_manifest(ckpt: str) -> dict:
    try:
        with open(os.path.join(ckpt, MANIFEST), encoding="utf-8") as f:
            man = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{ckpt}/{MANIFEST} cannot be read ({type(e).__name__}): the "
                              f"checkpoint is damaged; resume from an earlier step-* folder")
    if man.get("format") != FORMAT:
        raise CheckpointError(f"{ckpt}: format {man.get('format')!r}, this partui reads {FORMAT!r}: "
                              f"save it again with this version")
    return man


# ---------------------------------------------------------------- writing
def begin(root: str) -> str:
    """A fresh folder for the ranks to write into, inside the save root (made if missing)."""
    os.makedirs(root, exist_ok=True)
    tmp = os.path.join(root, f".partial-{os.getpid()}-{next(_serial)}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    return tmp


def manifest_of(step: int, plan, cfg, model: str, training: dict) -> dict:
    eff = model_config_for(plan, cfg)
    return {"format": FORMAT, "step": step, "plan": plan.to_dict(), "model": model,
            "cfg": dataclasses.asdict(eff), "training": dict(training), "world": plan.world,
            "data_position": {"seed": training.get("seed", 0), "next_batch": step,
                              "samples_done": step * eff.batch}}


def commit(tmp: str, root: str, manifest: dict, keep: int | None = None) -> str:
    """The manifest (every file and its size) into `tmp`, then `tmp` renamed to its step's name:
    the checkpoint exists from that rename on. An older one of that name is moved aside first and
    removed after. Then the oldest beyond `keep` go."""
    files = {n: os.path.getsize(os.path.join(tmp, n)) for n in sorted(os.listdir(tmp))}
    manifest = dict(manifest, files=files)
    path = os.path.join(tmp, MANIFEST)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    final = os.path.join(root, step_name(manifest["step"]))
    old = None
    if os.path.exists(final):
        old = f"{tmp}.old"
        os.rename(final, old)
    os.rename(tmp, final)
    if old:
        shutil.rmtree(old, ignore_errors=True)
    if keep:
        for stale in saved_steps(root)[:-keep]:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def abandon(tmp: str) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- refusing
def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def check_files(ckpt: str, man: dict) -> None:
    for name, size in man.get("files", {}).items():
        p = os.path.join(ckpt, name)
        if not os.path.isfile(p):
            raise CheckpointError(f"{ckpt}: {name} is missing (written by the save, "
                                  f"{size} bytes): copy it back or resume from another checkpoint")
        got = os.path.getsize(p)
        if got != size:
            raise CheckpointError(f"{ckpt}: {name} is {got} bytes, the save wrote {size} "
                                  f"(truncated or changed): resume from another checkpoint")


def check_model(ckpt: str, man: dict, plan, cfg, training: dict) -> None:
    eff = dataclasses.asdict(model_config_for(plan, cfg))
    saved = man.get("cfg", {})
    diff = [k for k in eff if k in saved and saved[k] != eff[k]]
    if diff:
        there = ", ".join(f"{k} {saved[k]} there, {eff[k]} here" for k in diff[:4])
        fix = " ".join(f"{flag(k)} {saved[k]}" for k in diff[:4])
        raise CheckpointError(f"{ckpt} holds a different model ({there}): resume with the "
                              f"checkpoint's model ({man.get('model', 'tiny')}, {fix})")
    if man["plan"].get("dtype") != plan.dtype:
        raise CheckpointError(f"{ckpt} was saved in {man['plan'].get('dtype')}, this plan runs "
                              f"{plan.dtype}: resume with --dtype {man['plan'].get('dtype')}")
    for key in ("optim", "seed"):
        a, b = man.get("training", {}).get(key), training.get(key)
        if a is not None and b is not None and a != b:
            why = "its optimizer state" if key == "optim" else "its data order"
            raise CheckpointError(f"{ckpt} was trained with {flag(key)} {a}, this run "
                                  f"{flag(key)} {b} ({why} would not carry on): resume with "
                                  f"{flag(key)} {a}")


def expected_tensors(plan, cfg, optim: str) -> dict[str, list]:
    """fqn -> global shape of every tensor a plan of this model reads on load."""
    eff = model_config_for(plan, cfg)
    out = {}
    for name, shape in param_shapes(eff).items():
        out[f"model.{name}"] = list(shape)
        kinds = ["exp_avg", "exp_avg_sq"] if optim == "adamw" else []
        kinds += ["master"] if plan.dtype == "bf16" else []
        for k in kinds:
            out[f"optim.{name}.{k}"] = list(shape)
    return out


def check_tensors(ckpt: str, plan, cfg, optim: str) -> None:
    from kernels.comm import dcp      # torch: only once the torch-free checks have passed
    try:
        index = dcp.tensor_index(ckpt)
    except Exception as e:  # noqa: BLE001 - DCP's own error types vary: one line either way
        raise CheckpointError(f"{ckpt}/.metadata cannot be read ({type(e).__name__}): the "
                              f"checkpoint is damaged; resume from another checkpoint")
    for fqn, shape in expected_tensors(plan, cfg, optim).items():
        got = index.get(fqn)
        if got is None:
            raise CheckpointError(f"{ckpt} has no tensor {fqn}: it was not saved by this model "
                                  f"and optimizer; resume from a checkpoint of the same run")
        if got["shape"] != shape:
            raise CheckpointError(f"{ckpt}: {fqn} is {got['shape']} there, {shape} here: resume "
                                  f"with the checkpoint's model sizes")


def check_resume(path: str, plan, cfg, training: dict) -> tuple[str, dict]:
    """(checkpoint folder, manifest) when `plan` of model `cfg` can resume from `path`, else
    CheckpointError (one line). Nothing is read beyond the manifest, the file sizes and DCP's
    index."""
    ckpt = resolve(path)
    man = read_manifest(ckpt)
    check_files(ckpt, man)
    check_model(ckpt, man, plan, cfg, training)
    check_tensors(ckpt, plan, cfg, training.get("optim") or man.get("training", {}).get("optim", "adamw"))
    return ckpt, man


__all__ = ["CheckpointError", "resolve", "read_manifest", "begin", "commit", "abandon",
           "manifest_of", "check_resume", "saved_steps", "MANIFEST"]


def save_world(ctl, root: str, plan, cfg, model: str, training: dict, keep: int | None = None,
               kill_rank: int | None = None, fault: str | None = None) -> str:
    """Every rank writes its shards into a fresh folder; committed once all have replied.
    `kill_rank`: that rank SIGKILLs itself after writing (a test of the commit); `fault`: a known
    bug injected (kernels/checkpoint/faults.py, the labs)."""
    tmp = begin(root)
    try:
        steps = ctl.call("save", {"path": os.path.abspath(tmp), "kill_rank": kill_rank,
                                  "fault": fault})
    except BaseException:
        abandon(tmp)
        raise
    return commit(tmp, root, manifest_of(steps[0], plan, cfg, model, training), keep)
