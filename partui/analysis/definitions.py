"""What each column of the overlap tables counts (docs/architecture.md, "Definitions"): carried in
`df.attrs["definitions"]` by partui.analysis.overlap, so a DataFrame explains itself."""

DEFINITIONS = {
    "rank": "global rank",
    "step": "training step (since launch)",
    "op": "collective or point-to-point op name",
    "group": "process group the op ran in (dp, tp, pp, cp, ep, world)",
    "ops": "number of ops",
    "bytes": "bytes the ops moved",
    "window_ms": "the window: a rank's step span (by step) or its whole recorded run (by rank), ms",
    "compute_ms": "compute slices merged, minus blocked waits, ms",
    "comm_ms": "comm in flight, issue to completion, merged, ms",
    "overlapped_ms": "comm in flight while the rank computed (compute ∩ in flight), ms",
    "exposed_comm_ms": "comm in flight while the rank did not compute (in flight - overlapped), ms",
    "wait_ms": "time blocked waiting on ops, ms",
    "idle_ms": "window minus the union of compute and comm in flight, ms",
    "overlap_pct": "overlapped / comm in flight, % (HTA's definition)",
    "bubble_pct": "idle / window, %",
    "sim_bubble_pct": "the schedule's own bubble, simulated under the measured F / B / W times, %",
    "formula_bubble_pct": "the published formula's bubble for this schedule, %",
}
