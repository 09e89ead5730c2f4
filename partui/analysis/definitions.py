"""What every figure of `partui report` counts: one table, printed as the legend of a table or
markdown report, the `definitions` key of a json one, in `partui report --help` and in the docs.
"""
from __future__ import annotations

import re

TERMS = {
    "compute": "leaf spans that do arithmetic (layers, attention, experts, router, loss, "
               "optimizer, pipeline F / B / W actions), merged; container spans (a step, an F&B "
               "pair, a microbatch) never count, and neither do waits or posting an op",
    "wait": "the rank blocked on a comm op, or posting one (exposed: neither compute nor overlap)",
    "comm in flight": "an op from its issue to its transfer's completion, merged; a p2p pair "
                      "from the send's post to the recv's completion (gloo's p2p has no future: "
                      "the recv's wait tells when the bytes arrived)",
    "python": "viztracer's Python function calls (cat FEE; on the compute track where they nest "
              "under its spans): shown, never compute, comm or wait, so they change no figure",
    "window": "a rank's step spans, summed; time between steps (the controller, a user deciding) "
              "enters no figure; without step spans, the rank's first to last event",
    "torch.profiler GPU traces": "compute is every kernel that is not comm, on any stream, merged; comm "
                                 "in flight is the comm kernels (a family of comm_kernels.FAMILIES: NCCL, "
                                 "RCCL, DeepEP, NVSHMEM, peer-to-peer memcpy, or --comm-kernels REGEX), "
                                 "merged; other memcpy / memset are neither. A comm kernel beside a compute "
                                 "kernel is overlapped, not hidden: DeepEP and NCCL kernels hold SMs while "
                                 "they wait for remote data, so the compute beside them ran on fewer SMs; "
                                 "only gpu_exposed_comm_ms (no compute kernel running at all) is certain loss",
}

COLUMNS = {
    "rank": "global rank",
    "step": "step number",
    "window_ms": "the measured window (step spans, summed)",
    "compute_ms": "compute in the window",
    "comm_ms": "comm in flight in the window",
    "overlapped_ms": "comm in flight while the rank computed",
    "exposed_comm_ms": "comm_ms - overlapped_ms: comm in flight while the rank did not compute",
    "wait_ms": "time blocked on or posting comm ops",
    "idle_ms": "window covered by neither compute nor comm in flight",
    "overlap_pct": "overlapped_ms / comm_ms (HTA's comm-comp overlap)",
    "bubble_pct": "100 - compute / window: every reason not to compute (idle, waiting, exposed "
                  "comm, the loss / grad / mirror syncs and the optimizer's gaps)",
    "cpu_ms": "thread CPU time the outermost compute spans got",
    "no_core_ms": "those spans' wall time outside waits less their CPU time: runnable, no core",
    "pipe_ms": "pipeline window: each step, the rank's first to last F / B / W action",
    "pipe_bubble_pct": "100 - compute in the pipeline window / pipe_ms: the measured pipeline bubble",
    "rest_ms": "window_ms - pipe_ms: loss all-reduce, mirror and grad sync, optimizer",
    "sim_bubble_pct": "the simulator's bubble for this rank's stage in its own pipeline window, "
                      "replaying each step under that step's own timing: each action's compute, "
                      "each post's time and the rank's dispatch between actions (rank time, not "
                      "compute), each transfer's measured time (send's post to recv's "
                      "completion, where the receiver already waited; else its edge's mean)",
    "sim_ideal_bubble_pct": "the schedule's own bubble for this rank's stage: the simulator under "
                            "mean F / B / W over all ranks, comm free (transfers and posts take 0)",
    "formula_bubble_pct": "the published formula's bubble, as a % of the ideal simulated step; "
                          "negative where the formula subtracts more than it adds (ZB1P's F+B-2W, "
                          "DualPipe's F&B+B-3W go below 0 when W, the weight-grad time, is large "
                          "against F and B): the formula assumes W small, not an error",
    "op": "comm op",
    "group": "process group",
    "ops": "number of ops",
    "bytes": "bytes moved by this rank, summed over ranks",
    "run": "this trace, the --vs one, and their difference",
    "trace": "trace file",
    "step_ms": "mean step time, first rank's start to last rank's end",
    "k": "--by schedule: the action's place in its rank's list",
    "action": "the executor's action span (F, B, BW, W, FB pair)",
    "start_ms": "recorded start, from the step's first action on any rank",
    "dur_ms": "recorded wall time of the action",
    "sim_start_ms": "the simulator's start for the same action under the trace's costs",
    "sim_dur_ms": "the simulator's duration (the trace's mean compute for its kind)",
    "late_ms": "start_ms - sim_start_ms",
    "waited_ms": "waits inside the action: its input had not arrived (a peer's send)",
    "why": "a peer's send, a core (whichever took over 5% of the action and more of it), or "
           "nothing: the action ran its cost and inherited its lateness",
    "layer": "--routing: MoE layer index",
    "tokens": "--routing: choices that reached an expert (after the all-to-all), all ranks",
    "min": "--routing: fewest tokens any expert got",
    "max": "--routing: most tokens any expert got",
    "std": "--routing: standard deviation of tokens per expert",
    "max_violation": "--routing: max tokens per expert / mean - 1 (0: perfectly balanced)",
    "dropped": "--routing: choices over an expert's capacity, not computed",
    "dead": "--routing: experts that got no token",
    "balance_loss": "--routing: GShard's aux loss or DeepSeek's sequence-wise loss (alpha included)",
    "bias_min": "--routing: smallest DeepSeek selection bias this step routed with",
    "bias_max": "--routing: largest DeepSeek selection bias this step routed with",
    "eN": "--routing: tokens expert N got",
    "comm_comp_overlap_pct": "HTA's per-rank overlap under HTA's rule (torch.profiler GPU traces): "
                             "kernels named ^nccl.*Kernel against the other kernels (names holding "
                             "Memcpy / Memset are neither; other comm families do not enter), each "
                             "merged, times rounded inward to whole us as HTA's parser does; after HTA's "
                             "filter: kernels launched before the last ProfilerStep (--include-last-step: "
                             "up to its end)",
    "gpu_window_ms": "the rank's GPU window: its first kernel's start to its last kernel's end",
    "kernel_compute_ms": "non-comm kernels on any stream, merged, in the GPU window",
    "kernel_comm_ms": "comm kernels (any family), merged",
    "kernel_overlapped_ms": "comm kernels running while a compute kernel ran (overlapped, not hidden: "
                            "the comm kernel held SMs the compute could not use)",
    "gpu_exposed_comm_ms": "kernel_comm_ms - kernel_overlapped_ms: a comm kernel running while no "
                           "compute kernel ran on any stream",
    "compute_idle_ms": "gpu_window_ms - kernel_compute_ms: the window no compute kernel covered",
    "kernel_overlap_pct": "kernel_overlapped_ms / kernel_comm_ms",
    "stream": "a GPU stream (Kineto's track name)",
    "kernels": "kernels and memcpys run on it",
    "comm_kernels": "those of a comm family",
    "busy_ms": "its kernels merged",
    "comm_busy_ms": "its comm kernels merged",
    "busy_pct": "busy_ms / the rank's gpu_window_ms",
    "pair": "--by pair: the F&B pair (partui's FB span; a torch.profiler trace: the annotation holding the parts)",
    "layer_k": "--by pair on a torch.profiler trace: the k-th annotation of this name on the rank (its layer)",
    "part": "--by pair: the planner's part (planning/pipeline/fb_order.py) the annotation names (kineto_pairs.PART_NAMES)",
    "annotation": "--by pair: the user annotation as recorded, e.g. dispatch(F)",
    "launched": "--by pair: GPU kernels launched while the annotation was open (launch correlation ids)",
    "gpu_ms": "--by pair: those kernels merged: the part's GPU time",
    "a2a_ms": "--by pair: its comm kernels merged: the all-to-all it flew",
    "a2a_under_ms": "--by pair: a2a_ms while a compute kernel (any part's) ran",
    "a2a_exposed_ms": "--by pair: a2a_ms while no compute kernel ran",
    "under": "--by pair: the other parts whose compute kernels ran beside its all-to-all",
    "family": "comm kernel family (comm_kernels.FAMILIES, or --comm-kernels)",
    "kernel_ms": "the family's kernels' durations summed (not merged)",
    "peak_mib": "--memory: the most the rank's memory account held at once (bytes of live tensors "
                "by kind, kernels/memory.py; the kinds below are their values at that moment)",
    "peak_at": "--memory: the innermost action span (F / B / W / FB, microbatch, optimizer, step) "
               "open at the peak",
    "params_mib": "--memory: parameters this rank holds (ZeRO-3: its shards)",
    "grads_mib": "--memory: gradient buffers (ZeRO-2/3: shards)",
    "optimizer_mib": "--memory: optimizer state (AdamW m, v; fp32 masters of bf16 params)",
    "workspace_mib": "--memory: the optimizer's reused scratch, held between steps (not state)",
    "activations_mib": "--memory: what layers saved for backward, every microbatch and chunk "
                       "not yet through its backward (or W)",
    "gathered_mib": "--memory: ZeRO-3's all-gathered layer weights (the layer in use and its prefetch)",
    "comm_mib": "--memory: p2p buffers in flight: posted recvs and unfinished sends",
    "recompute_activations_mib": "whatif --recompute: the formula's activation peak under the "
                                 "mode (in-flight microbatches x what their blocks keep: inputs "
                                 "under full; matmul outputs and norm inputs under selective)",
    "saved_mib": "whatif --recompute: activations_mib (the trace's measured peak) less that",
    "extra_compute_ms": "whatif --recompute: the rank's recorded block forwards per step x the "
                        "share the mode runs again (full 1; selective: norms, Q K^T and "
                        "softmax, SwiGLU's activation, by operation count)",
    "extra_compute_pct": "whatif --recompute: extra_compute_ms / the rank's mean step",
}


def legend(columns) -> list[str]:
    """Lines defining the terms and every column present."""
    out = ["definitions:"] + [f"  {k}: {v}" for k, v in TERMS.items()]
    out += [f"  {c}: {COLUMNS[c]}" for c in columns if c in COLUMNS]
    if any(re.fullmatch(r"e\d+", c) for c in columns):
        out.append(f"  eN: {COLUMNS['eN']}")
    return out


def _doc(column: str) -> str | None:
    return COLUMNS.get(column) or (COLUMNS["eN"] if re.fullmatch(r"e\d+", column) else None)


def definitions(columns) -> dict:
    """The json form: the terms and the present columns."""
    return {**TERMS, **{c: _doc(c) for c in columns if _doc(c)}}


def help_text() -> str:
    """`partui report --help`'s epilog: every column."""
    width = max(len(c) for c in COLUMNS)
    return "\n".join(["definitions:"] + [f"  {k}: {v}" for k, v in TERMS.items()] + ["columns:"]
                     + [f"  {c:<{width}}  {v}" for c, v in COLUMNS.items()])
