"""Checkpoints in torch DCP: a rank's hand-made shards saved as boxes of the full tensors
(state.py says which), resharded by DCP's planner on load under any other plan.

    state.py      the rank's state dict: params, optimizer state, buffers, step, RNG, as boxes
    reference.py  the single-process model and reference from a checkpoint (whole tensors)
"""
from kernels.checkpoint import faults
from kernels.checkpoint.state import apply_loaded, rank_state
from kernels.comm import dcp

__all__ = ["save_engine", "load_engine"]


def save_engine(eng, path: str, fault: str | None = None) -> None:
    """Every rank at once: what this rank owns into the DCP folder `path` (fault: a known bug
    injected, kernels/checkpoint/faults.py)."""
    dcp.save(rank_state(eng, holds=False, fault=fault), path, dedup=fault != "write_twice")


def load_engine(eng, path: str, fault: str | None = None) -> None:
    """Every rank at once: everything this rank holds, read from whichever saved boxes cover it."""
    saved = dcp.tensor_index(path)
    rng_ranks = {int(k.removeprefix("rng.rank")) for k in saved if k.startswith("rng.rank")}
    sd = rank_state(eng, holds=True, rng_ranks=rng_ranks)
    dcp.load(sd, path)
    apply_loaded(eng, sd)
    faults.on_load(eng, fault)
