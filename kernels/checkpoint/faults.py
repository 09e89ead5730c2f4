"""The known silent checkpoint failures, injected on purpose (tests/lab/test_checkpoint_labs.py
shows each one caught). Each is a bug real converters shipped; none runs unless a fault is named.

    swap_tp_chunks       save: a TP rank's SwiGLU / QKV rows written at the other rank's place
                         (Megatron's reordered linear_fc1 chunks after a TP change)
    swap_moments         save: AdamW's m and v of wk written under wv's name and back (moments
                         loaded onto the wrong parameter after a ZeRO change)
    drop_data_position   load: the data position forgotten (a DP change that dropped a rank's
                         data-loader state: the data order changes)
    sum_mirror           load: DualPipe's two copies of a stage added instead of one taken
    write_twice          save: both DualPipe copies written (no dedup): DCP refuses the overlap
"""
from __future__ import annotations

SAVE_FAULTS = ("swap_tp_chunks", "swap_moments", "write_twice")
LOAD_FAULTS = ("drop_data_position", "sum_mirror")
FUSED = ("mlp.w1.weight", "mlp.w3.weight", "attn.wq.weight", "attn.wk.weight", "attn.wv.weight")


def check_fault(fault: str | None, allowed: tuple) -> None:
    if fault is not None and fault not in allowed:
        raise ValueError(f"unknown checkpoint fault {fault!r}: pick one of {', '.join(allowed)}")


def mirrored(off: tuple, t, prm) -> tuple:
    """The box reflected along the dim the Param is split on: chunk r of tp at chunk tp-1-r."""
    if prm.shard is None:
        return off
    out = list(off)
    for d, s in enumerate(prm.shard):
        if (s.stop or prm.global_shape[d]) - (s.start or 0) < prm.global_shape[d]:
            out[d] = prm.global_shape[d] - off[d] - t.shape[d]
    return tuple(out)


def on_save(col, params: dict, fault: str | None) -> None:
    """Corrupt what `col` (state.Collect) is about to write, as the named bug would."""
    check_fault(fault, SAVE_FAULTS)
    if fault == "swap_tp_chunks":
        for name, boxes in col.model.items():
            if name.endswith(FUSED) and name in params:
                col.model[name] = [(mirrored(off, t, params[name]), t) for off, t in boxes]
    elif fault == "swap_moments":
        a, b = "layers.0.attn.wk.weight", "layers.0.attn.wv.weight"
        if a in col.optim and b in col.optim:
            col.optim[a], col.optim[b] = col.optim[b], col.optim[a]


def on_load(eng, fault: str | None) -> None:
    """Corrupt what a rank just loaded, as the named bug would."""
    check_fault(fault, LOAD_FAULTS)
    if fault == "drop_data_position":
        eng.step_count = 0
    elif fault == "sum_mirror":
        for prm in eng.params.values():
            if "pp_mirror" in prm.replicated_over and prm.data.numel():
                prm.data.mul_(2)
