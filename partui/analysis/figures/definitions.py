"""Every figure partui prints, defined once: one record per figure (its name, unit, what it counts
and which views print it), as `plan_field` is for the Plan's fields. Every legend, `--help`, json
`definitions` key and DataFrame `attrs["definitions"]` reads this table; other modules select the
figures they print by name (`definitions_of`). A name means one thing: where two views count two
different things they get two names (the report's `exposed_comm_ms`, comm in flight while the rank
did not compute; whatif's `blocked_ms`, the time the rank blocks in waits in a replay).

Stdlib only (no pandas, no torch): the app's Trace tab reads its legend from here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# the views that print figures: `--help` of each lists the figures whose `views` name it
REPORT = "report"                  # partui report: --by rank / step / op, --vs; World.report
BY_PAIR = "report --by pair"
BY_SCHEDULE = "report --by schedule"
GPU = "report (GPU traces)"        # torch.profiler GPU traces: the gpu / streams / families tables
MEMORY = "report --memory"
ROUTING = "report --routing"
STEPS = "step lines"               # World.step, partui run --json, the app's step lines and rank cards
SHOW = "World.show"
WHATIF = "whatif"
WHATIF_PP = "whatif --pp"
RECOMPUTE = "whatif --recompute"
SAVED = "Trace tab saved"          # the app's Trace tab: what overlap saves under the link
BLAME = "blame"
PLAN = "plan"                      # partui plan's memory table
FLAGGED = {BY_PAIR: "--by pair", BY_SCHEDULE: "--by schedule", MEMORY: "--memory", ROUTING: "--routing",
           WHATIF_PP: "whatif --pp", RECOMPUTE: "whatif --recompute"}


@dataclass(frozen=True)
class Figure:
    name: str                      # the column (or term, or summary figure) as printed
    unit: str                      # ms, s, %, MiB, bytes, count, ratio; "" for a label or a term
    counts: str                    # what it counts: the definition every view prints
    views: tuple[str, ...]         # which views print it

    @property
    def definition(self) -> str:
        """What it counts as printed: a figure only one flag's view prints says which flag."""
        flag = FLAGGED.get(self.views[0]) if len(self.views) == 1 else None
        return f"{flag}: {self.counts}" if flag else self.counts

    def __post_init__(self):
        if not self.counts or not self.views:
            raise ValueError(f"figure {self.name!r}: give it what it counts and the views that print it")


def figure(name: str, unit: str, views, counts: str) -> Figure:
    return Figure(name, unit, counts, (views,) if isinstance(views, str) else tuple(views))


_RECORDS = (
    # ---- terms: the words the figures are built from (every report's legend opens with them)
    figure("compute", "", REPORT, "leaf spans that do arithmetic (layers, attention, experts, router, "
           "loss, optimizer, pipeline F / B / W actions), merged; container spans (a step, an F&B pair, "
           "a microbatch) never count, and neither do waits or posting an op"),
    figure("wait", "", REPORT, "the rank blocked on a comm op, or posting one (exposed: neither "
           "compute nor overlap)"),
    figure("comm in flight", "", REPORT, "an op from its issue to its transfer's completion, merged; a "
           "p2p pair from the send's post to the recv's completion (gloo's p2p has no future: the "
           "recv's wait tells when the bytes arrived)"),
    figure("python", "", REPORT, "viztracer's Python function calls (cat FEE; on the compute track "
           "where they nest under its spans): shown, never compute, comm or wait, so they change no "
           "figure"),
    figure("gc", "", REPORT, "the cyclic garbage collector's pauses while tracing (cat gc, the rank's "
           "gc track): shown, never compute, comm or wait; a pause inside a compute span still counts "
           "as that span's compute, so the track says where one stretched a span"),
    figure("window", "", REPORT, "a rank's step spans, summed; time between steps (the controller, a "
           "user deciding) enters no figure; without step spans, the rank's first to last event"),
    figure("torch.profiler CPU traces", "", REPORT, "a CPU-only torch.profiler trace (no GPU kernel, "
           "none of partui's own ranges) is read by op names: compute is the aten::* CPU ops, merged; "
           "comm in flight is the gloo:* ranges (on gloo's thread) and the c10d::* calls, merged; no op "
           "is a wait; a rank's window is its ProfilerStep#N spans, summed (without them its first to "
           "last event)"),
    figure("torch.profiler GPU traces", "", REPORT, "compute is every kernel that is not comm, on any "
           "stream, merged; comm in flight is the comm kernels (a family of comm_kernels.FAMILIES: "
           "NCCL, RCCL, DeepEP, NVSHMEM, peer-to-peer memcpy, or --comm-kernels REGEX), merged; other "
           "memcpy / memset are neither. A comm kernel beside a compute kernel is overlapped, not "
           "hidden: DeepEP and NCCL kernels hold SMs while they wait for remote data, so the compute "
           "beside them ran on fewer SMs; only gpu_exposed_comm_ms (no compute kernel running at all) "
           "is certain loss. A kernel belongs to the step whose CPU-side launch it follows (the call "
           "carrying its correlation id, any launch API; one no call claims, the last step begun before it "
           "ran), never to the CPU window it runs in; a step's "
           "window is its kernels' first start to last end on the GPU, its kernels swept alone, and a "
           "rank's figures are its steps' summed; kernels launched outside every ProfilerStep count "
           "nowhere. Every view (this table, --by step / op / pair, the gpu and streams tables, the "
           "comm kernels line, json) counts these same kernels"),
    # ---- keys shared by many views
    figure("rank", "", (REPORT, BY_PAIR, BY_SCHEDULE, GPU, MEMORY, STEPS, WHATIF, RECOMPUTE, SAVED,
                        BLAME), "global rank ('step': the row for the whole step, where a table has one)"),
    figure("step", "", (REPORT, ROUTING, STEPS), "step number"),
    figure("stage", "", (WHATIF_PP, BLAME), "pipeline stage"),
    # ---- the overlap report (planning.intervals.figures: the step lines count the same way)
    figure("window_ms", "ms", (REPORT, STEPS), "the measured window: the rank's step spans, summed "
           "(one step: its start to end); on a torch.profiler GPU trace each step's kernels' GPU extent"),
    figure("compute_ms", "ms", (REPORT, STEPS), "compute in the window"),
    figure("comm_ms", "ms", (REPORT, STEPS), "comm in flight in the window"),
    figure("overlapped_ms", "ms", (REPORT, STEPS), "comm in flight while the rank computed"),
    figure("exposed_comm_ms", "ms", (REPORT, STEPS), "comm_ms - overlapped_ms: comm in flight while "
           "the rank did not compute"),
    figure("wait_ms", "ms", (REPORT, STEPS), "time blocked on or posting comm ops; '-' (json null) "
           "where the trace records no waits: a torch.profiler trace's kernels and gloo / aten ops say "
           "nothing of blocking (partui run --profile's own ranges do)"),
    figure("idle_ms", "ms", REPORT, "window covered by neither compute nor comm in flight"),
    figure("overlap_pct", "%", (REPORT, STEPS), "overlapped_ms / comm_ms (HTA's comm-comp overlap)"),
    figure("bubble_pct", "%", REPORT, "100 - compute / window: every reason not to compute (idle, "
           "waiting, exposed comm, the loss / grad / mirror syncs and the optimizer's gaps)"),
    figure("cpu_ms", "ms", REPORT, "thread CPU time the outermost compute spans got"),
    figure("no_core_ms", "ms", (REPORT, BY_SCHEDULE), "those spans' wall time outside waits less "
           "their CPU time: runnable, no core"),
    figure("pipe_ms", "ms", REPORT, "pipeline window: each step, the rank's first to last F / B / W "
           "action"),
    figure("pipe_bubble_pct", "%", REPORT, "100 - compute in the pipeline window / pipe_ms: the "
           "measured pipeline bubble"),
    figure("rest_ms", "ms", (REPORT, WHATIF_PP), "the step outside the pipeline window (loss "
           "all-reduce, mirror and grad sync, optimizer): window_ms - pipe_ms; whatif --pp: the "
           "recorded one, slowest rank, mean over the trace's steps"),
    figure("sim_bubble_pct", "%", (REPORT, WHATIF_PP), "the schedule simulator's bubble for the "
           "stage: its idle share of its own first-to-last action window. report: replaying each "
           "step under that step's own timing (each action's compute, each post's time and the "
           "rank's dispatch between actions, each transfer's measured time: send's post to recv's "
           "completion where the receiver already waited, else its edge's mean); whatif --pp: the "
           "new plan under the trace's mean costs"),
    figure("sim_ideal_bubble_pct", "%", REPORT, "the schedule's own bubble for this rank's stage: the "
           "simulator under mean F / B / W over all ranks, comm free (transfers and posts take 0)"),
    figure("formula_bubble_pct", "%", REPORT, "the published formula's bubble, as a % of the ideal "
           "simulated step; negative where the formula subtracts more than it adds (ZB1P's F+B-2W, "
           "DualPipe's F&B+B-3W go below 0 when W, the weight-grad time, is large against F and B): "
           "the formula assumes W small, not an error"),
    figure("op", "", REPORT, "comm op"),
    figure("group", "", REPORT, "process group"),
    figure("ops", "count", (REPORT, BLAME), "number of ops (blame's critical path: merged into the row)"),
    figure("bytes", "bytes", REPORT, "bytes moved by this rank, summed over ranks; '-' (json null) "
           "where no op of the row recorded its size: a torch.profiler trace's kernels and gloo ops "
           "carry none"),
    figure("run", "", REPORT, "--vs: this trace, the --vs one, and their difference"),
    figure("trace", "", REPORT, "--vs: trace file"),
    figure("step_ms", "ms", STEPS, "the slowest rank's step, its own start to end"),
    figure("world_step_ms", "ms", REPORT, "a traced step from the first rank's start to the last rank's "
           "end (--vs: mean over the traced steps); on a GPU trace, its kernels' (by launching step)"),
    figure("loss", "", STEPS, "the step's global loss"),
    figure("max_abs_grad_err", "", STEPS, "--check: largest gradient error against the reference"),
    # ---- --by schedule
    figure("k", "count", BY_SCHEDULE, "the action's place in its rank's list"),
    figure("action", "", BY_SCHEDULE, "the executor's action span (F, B, BW, W, FB pair)"),
    figure("start_ms", "ms", BY_SCHEDULE, "recorded start, from the step's first action on any rank"),
    figure("dur_ms", "ms", BY_SCHEDULE, "recorded wall time of the action"),
    figure("sim_start_ms", "ms", BY_SCHEDULE, "the simulator's start for the same action under the "
           "trace's costs"),
    figure("sim_dur_ms", "ms", BY_SCHEDULE, "the simulator's duration (the trace's mean compute for its "
           "kind)"),
    figure("late_ms", "ms", BY_SCHEDULE, "start_ms - sim_start_ms"),
    figure("waited_ms", "ms", BY_SCHEDULE, "waits inside the action: its input had not arrived (a "
           "peer's send)"),
    figure("why", "", BY_SCHEDULE, "a peer's send, a core (whichever took over 5% of the action and "
           "more of it), or nothing: the action ran its cost and inherited its lateness"),
    # ---- --routing
    figure("layer", "", ROUTING, "MoE layer index"),
    figure("tokens", "count", ROUTING, "choices that reached an expert (after the all-to-all), all ranks"),
    figure("min", "count", ROUTING, "fewest tokens any expert got"),
    figure("max", "count", ROUTING, "most tokens any expert got"),
    figure("std", "count", ROUTING, "standard deviation of tokens per expert"),
    figure("max_violation", "ratio", ROUTING, "max tokens per expert / mean - 1 (0: perfectly balanced)"),
    figure("dropped", "count", ROUTING, "choices over an expert's capacity, not computed"),
    figure("dead", "", ROUTING, "experts that got no token"),
    figure("balance_loss", "", ROUTING, "GShard's aux loss or DeepSeek's sequence-wise loss (alpha "
           "included)"),
    figure("bias_min", "", ROUTING, "smallest DeepSeek selection bias this step routed with"),
    figure("bias_max", "", ROUTING, "largest DeepSeek selection bias this step routed with"),
    figure("eN", "count", ROUTING, "tokens expert N got"),
    # ---- torch.profiler GPU traces
    figure("comm_comp_overlap_pct", "%", GPU, "HTA's per-rank overlap under HTA's rule: kernels named "
           "^nccl.*Kernel against the other kernels (names holding Memcpy / Memset are neither; other "
           "comm families do not enter), each merged, times rounded inward to whole us as HTA's parser "
           "does; after HTA's filter: kernels launched before the last ProfilerStep "
           "(--include-last-step: up to its end). HTA's, beside ours (overlap_pct), and not the same "
           "reading: HTA drops the last step's kernels, sweeps each rank's kernels as one window rather "
           "than step by step, counts only NCCL as comm, and reads '-' where there is none (DeepEP)"),
    figure("gpu_window_ms", "ms", GPU, "the rank's GPU window: each step's kernels' first start to "
           "last end, summed over its steps (the main table's window_ms on a GPU trace)"),
    figure("kernel_compute_ms", "ms", GPU, "non-comm kernels on any stream, merged, in the GPU window"),
    figure("kernel_comm_ms", "ms", GPU, "comm kernels (any family), merged"),
    figure("kernel_overlapped_ms", "ms", GPU, "comm kernels running while a compute kernel ran "
           "(overlapped, not hidden: the comm kernel held SMs the compute could not use)"),
    figure("gpu_exposed_comm_ms", "ms", GPU, "kernel_comm_ms - kernel_overlapped_ms: a comm kernel "
           "running while no compute kernel ran on any stream"),
    figure("compute_idle_ms", "ms", GPU, "gpu_window_ms - kernel_compute_ms: the window no compute "
           "kernel covered"),
    figure("kernel_overlap_pct", "%", GPU, "kernel_overlapped_ms / kernel_comm_ms"),
    figure("stream", "", GPU, "a GPU stream (Kineto's track name)"),
    figure("kernels", "count", GPU, "kernels the row counts: a stream's (memcpys included), a comm "
           "family's"),
    figure("comm_kernels", "count", GPU, "a stream's kernels of a comm family"),
    figure("busy_ms", "ms", GPU, "a stream's kernels merged"),
    figure("comm_busy_ms", "ms", GPU, "a stream's comm kernels merged"),
    figure("busy_pct", "%", GPU, "busy_ms / the rank's gpu_window_ms"),
    figure("family", "", GPU, "comm kernel family (comm_kernels.FAMILIES, or --comm-kernels)"),
    figure("kernel_ms", "ms", GPU, "the family's kernels' durations summed (not merged)"),
    # ---- --by pair (partui's F&B pairs, or a torch.profiler trace's part annotations)
    figure("pair", "", BY_PAIR, "the F&B pair (partui's FB span; a torch.profiler trace: the "
           "annotation holding the parts)"),
    figure("all_to_all", "", BY_PAIR, "which all-to-all the part issued: DISPATCH / COMBINE, F or "
           "B, its layer and microbatch ('counts ... (blocking)': uneven dispatch's exchange of counts)"),
    figure("issued_in", "", BY_PAIR, "the part (or layer span) whose span holds the all-to-all's issue"),
    figure("in_flight_ms", "ms", BY_PAIR, "the all-to-all from its issue to its completion, as the "
           "comm layer recorded it"),
    figure("under_other_ms", "ms", BY_PAIR, "in_flight_ms while a part of the pair's other microbatch "
           "computed (less its waits)"),
    figure("exposed_ms", "ms", BY_PAIR, "in_flight_ms while no part of the pair computed: a wait, or "
           "posting an op, inside a part is not compute"),
    figure("under", "", BY_PAIR, "the other microbatch's parts that ran while the all-to-all "
           "was in flight"),
    figure("layer_k", "count", BY_PAIR, "a torch.profiler trace: the k-th annotation of this name on "
           "the rank (its layer)"),
    figure("part", "", BY_PAIR, "the planner's part (planning/pipeline/fb_order.py) the annotation "
           "names (pair_parts.PART_NAMES)"),
    figure("annotation", "", BY_PAIR, "the user annotation as recorded, e.g. dispatch(F)"),
    figure("launched", "count", BY_PAIR, "GPU kernels launched while the annotation was open (launch "
           "correlation ids)"),
    figure("gpu_ms", "ms", BY_PAIR, "those kernels merged: the part's GPU time"),
    figure("a2a_ms", "ms", BY_PAIR, "its comm kernels merged: the all-to-all it flew"),
    figure("a2a_under_ms", "ms", BY_PAIR, "a2a_ms while a compute kernel (any part's) ran"),
    figure("a2a_exposed_ms", "ms", BY_PAIR, "a2a_ms while no compute kernel ran"),
    # ---- --memory
    figure("estimate MiB", "MiB", PLAN, "a rank's peak estimated from the plan's sizes alone, "
           "before anything is built (planning/memory_estimate.py): params, grads and AdamW state by "
           "the ZeRO split, ZeRO-3's two largest gathered layers, and in-flight microbatches x the "
           "heaviest chunk's saved bytes; ~: activations by a dense-equivalent (tp, cp, MoE). "
           "The plan is refused when the world's sum exceeds MemAvailable"),
    figure("peak_mib", "MiB", MEMORY, "the most the rank's memory account held at once (bytes of live "
           "tensors by kind, kernels/memory.py; the kinds below are their values at that moment)"),
    figure("peak_at", "", MEMORY, "the innermost action span (F / B / W / FB, microbatch, optimizer, "
           "step) open at the peak"),
    figure("params_mib", "MiB", MEMORY, "parameters this rank holds (ZeRO-3: its shards)"),
    figure("grads_mib", "MiB", MEMORY, "gradient buffers (ZeRO-2/3: shards)"),
    figure("optimizer_mib", "MiB", MEMORY, "optimizer state (AdamW m, v; fp32 masters of bf16 params)"),
    figure("workspace_mib", "MiB", MEMORY, "the optimizer's reused scratch, held between steps (not "
           "state)"),
    figure("activations_mib", "MiB", MEMORY, "what layers saved for backward, every microbatch and "
           "chunk not yet through its backward (or W), at the peak"),
    figure("gathered_mib", "MiB", MEMORY, "ZeRO-3's all-gathered layer weights (the layer in use and "
           "its prefetch)"),
    figure("comm_mib", "MiB", MEMORY, "p2p buffers in flight: posted recvs and unfinished sends"),
    # ---- whatif: the replay of the trace's op graph under a link (partui.analysis.replay.whatif)
    figure("recorded_step_ms", "ms", WHATIF, "the rank's step as the trace recorded it (the step row: "
           "the slowest rank's)"),
    figure("predicted_step_ms", "ms", (WHATIF, WHATIF_PP, SAVED), "the step the what-if predicts: the "
           "rank's step replayed under the link (whatif, saved; the step row: the slowest rank); "
           "whatif --pp: sim_pipe_ms + rest_ms"),
    figure("blocked_ms", "ms", (WHATIF, SAVED), "time the rank blocks in waits in the replay, each "
           "wait's recorded own time past its op's end included (not exposed_comm_ms: comm in "
           "flight while the rank did not compute may hold no wait)"),
    figure("comm_in_flight_ms", "ms", (WHATIF, SAVED), "comm in flight in the replay under the link: "
           "from each op's issue to its modelled end, merged"),
    figure("busy_overlap_pct", "%", WHATIF, "comm_in_flight_ms during the replay's busy stretches / "
           "comm_in_flight_ms"),
    figure("replayed_busy_ms", "ms", WHATIF, "the replay's busy stretches merged: the recorded wall "
           "time between comm events not spent waiting (compute and the host work around it), x "
           "--compute-scale"),
    figure("measured_step_ms", "ms", WHATIF, "--measured: the other trace's step (mean over steps, "
           "warm-up out, slowest rank)"),
    figure("error_pct", "%", WHATIF, "--measured: (predicted_step_ms - measured_step_ms) / "
           "measured_step_ms"),
    figure("no_overlap_step_ms", "ms", SAVED, "the rank's step replayed with every send and collective "
           "waited right after its issue (no busy time while one is in flight; a recv keeps its "
           "place), same link, same busy stretches"),
    figure("saved_ms", "ms", SAVED, "no_overlap_step_ms - predicted_step_ms: what this op graph's "
           "overlap saves on this link (against the same graph serialized: under --overlap the "
           "runner's half microbatches stay, with twice the all-to-alls of the plan without it)"),
    figure("sim_pipe_ms", "ms", WHATIF_PP, "the simulator's makespan of the new plan's pipeline"),
    figure("peak_activations_mib", "MiB", RECOMPUTE, "the trace's measured activation peak (the most "
           "the rank's activations held at once)"),
    figure("recompute_activations_mib", "MiB", RECOMPUTE, "the formula's activation peak under the "
           "mode (in-flight microbatches x what their blocks keep: inputs under full; matmul outputs "
           "and norm inputs under selective)"),
    figure("saved_mib", "MiB", RECOMPUTE, "peak_activations_mib less recompute_activations_mib"),
    figure("extra_compute_ms", "ms", RECOMPUTE, "the rank's recorded block forwards per step x the "
           "share the mode runs again (full 1; selective: norms, Q K^T and softmax, SwiGLU's "
           "activation, by operation count)"),
    figure("extra_compute_pct", "%", RECOMPUTE, "extra_compute_ms / the rank's mean step"),
    # ---- World.show
    figure("name", "", SHOW, "the tensor's name in the model"),
    figure("global_shape", "", SHOW, "the full tensor's shape"),
    figure("local_shape", "", SHOW, "this rank's piece's shape"),
    figure("piece", "", SHOW, "where this rank's piece sits in the global tensor: whole, a slice per "
           "dim, or a flat range (ZeRO)"),
    figure("grad_piece", "", SHOW, "where this rank's gradient piece sits ('not held here': another "
           "rank's)"),
    figure("norm", "", SHOW, "L2 norm of this rank's piece"),
    figure("absmax", "", SHOW, "largest |value| of this rank's piece"),
    figure("optimizer_steps", "count", SHOW, "the steps AdamW has taken on this tensor (after steps 0 "
           "and 1: 2)"),
    figure("m_norm", "", SHOW, "L2 norm of AdamW's first moment m (this rank's piece)"),
    figure("v_norm", "", SHOW, "L2 norm of AdamW's second moment v (this rank's piece)"),
    # ---- blame (the ByteDance straggler paper's what-if; sections and summary figures)
    figure("recorded_s", "s", BLAME, "mean step time as recorded (first op's start to last op's end)"),
    figure("replayed_s", "s", BLAME, "mean step time replaying the graph with every op at its recorded "
           "duration (a collective: its recorded transfer, its end less its last member's start; a "
           "partui comm op whose wait began after that start only bounds it: the lesser of the bound "
           "and the typical) and launch gaps removed: each op starts when its lane and dependencies "
           "allow"),
    figure("ideal_s", "s", BLAME, "mean step time replaying the graph with every op at the typical "
           "duration of its type, launch gaps removed. Op-level traces: the mean over ranks and steps "
           "for compute, the median for communication (as the paper does). partui traces (a type: the "
           "k-th busy stretch of a stage's program, or a comm op on its group): compute at the fastest "
           "rank's median over steps (with 2 dp ranks a median cannot leave the straggler out; the "
           "fastest: the rank of the stage whose medians sum least), comm at the median of its "
           "measured transfers (a wait that began by the last member's issue; one begun later only "
           "bounds it)"),
    figure("slowdown", "ratio", BLAME, "straggler slowdown: replayed_s / ideal_s"),
    figure("by dp rank", "ratio", BLAME, "slowdown with only that dp rank's ops kept as recorded (the "
           "rest typical): mean replayed step / ideal_s"),
    figure("by stage", "ratio", BLAME, "slowdown with only that pipeline stage's ops kept as recorded"),
    figure("by op type", "ratio", BLAME, "slowdown with only that op type kept as recorded (a pipeline "
           "send and its recv count as one type: forward- or backward-pp-comm)"),
    figure("by worker", "ratio", BLAME, "slowdown with only that rank's ops kept as recorded; worst "
           "worker: the highest"),
    figure("steps", "count", BLAME, "steps replayed (a partui trace: its first step, the warm-up, left "
           "out). Op-level traces: each step replayed, step times averaged (the paper's mean). partui "
           "traces (a few steps on a shared machine): the median step, every op at its median over the "
           "steps (the same op of the same rank), replayed once: replaying each noisy step and taking "
           "a median reads a descheduled stretch anywhere on a step's paths as a straggler (measured: "
           "1.2-2.4 with nothing slowed)"),
    figure("top dp rank", "", BLAME, "the dp rank of the highest 'by dp rank' slowdown"),
    figure("top stage", "", BLAME, "the stage of the highest 'by stage' slowdown"),
    figure("top op type", "", BLAME, "the op type of the highest 'by op type' slowdown"),
    figure("worst worker", "", BLAME, "the rank of the highest 'by worker' slowdown"),
    figure("M_W ranks", "", BLAME, "the ranks M_W scores as the worst workers"),
    figure("M_S", "ratio", BLAME, "stage imbalance: (replayed_s - replayed with the last stage's ops "
           "typical) / (replayed_s - ideal_s): the share of the slowdown the last stage's straggling "
           "makes"),
    figure("M_W", "ratio", BLAME, "worst workers: the same share for the top 3% of ranks (at least "
           "one) scored by min(their dp rank's slowdown, their stage's slowdown)"),
    figure("critical path", "", BLAME, "the chain of ops that sets the slowest replayed step's end, "
           "walked back through what each op's start waited for (its lane, a dependency, a "
           "collective's last member to arrive); a wait is counted to the op waited on. Consecutive "
           "ops of one rank and type are one row"),
    figure("dp_rank", "", BLAME, "data-parallel rank"),
    figure("optype", "", BLAME, "op type (partui traces: a busy stretch of a stage's program, or a "
           "comm op on its group)"),
    figure("end_s", "s", BLAME, "critical path: the op's end in the replayed step"),
    figure("time_s", "s", BLAME, "critical path: the op's end less the previous row's end (its part "
           "of the step)"),
    figure("share_pct", "%", BLAME, "critical path: time_s / the step's replayed time"),
    figure("figure", "", BLAME, "summary: the figure's name (defined here)"),
    figure("value", "", BLAME, "summary: the figure's value"),
)

FIGURES: dict[str, Figure] = {}
for _f in _RECORDS:
    if _f.name in FIGURES:
        raise ValueError(f"figure {_f.name!r} is defined twice: a name means one thing; give the "
                         f"second meaning a name of its own")
    FIGURES[_f.name] = _f
TERMS = ("compute", "wait", "comm in flight", "python", "gc", "window", "torch.profiler GPU traces")
KINETO_CPU_TERMS = ("torch.profiler CPU traces",)   # a CPU Kineto trace without partui's ranges
EXPERT = re.compile(r"e\d+")   # --routing's per-expert columns e0, e1, ...: one record, eN


def figure_of(name: str) -> Figure | None:
    """The record defining a column, or None for a column that is no figure."""
    return FIGURES.get(name) or (FIGURES["eN"] if EXPERT.fullmatch(str(name)) else None)


def definitions_of(names) -> dict[str, str]:
    """{name: what it counts} of the named figures, in order; a name with no record is a
    ValueError naming it (define it here, once)."""
    missing = [n for n in names if figure_of(n) is None]
    if missing:
        raise ValueError(f"no definition for {', '.join(map(str, missing))}: add a figure(...) record "
                         f"to partui/analysis/figures/definitions.py")
    return {n: figure_of(n).definition for n in names}


def definitions(columns, terms: tuple[str, ...] = TERMS) -> dict[str, str]:
    """The json form and a frame's attrs["definitions"]: the terms and the present columns."""
    present = [c for c in columns if figure_of(c) is not None]
    if any(EXPERT.fullmatch(str(c)) for c in present):
        present = [c for c in present if not EXPERT.fullmatch(str(c))] + ["eN"]
    return definitions_of(list(dict.fromkeys([*terms, *present])))


def defined(frame):
    """The frame, its attrs["definitions"] set to its columns' words (the terms first)."""
    frame.attrs["definitions"] = definitions(frame.columns)
    return frame


def legend(columns, terms: tuple[str, ...] = TERMS) -> list[str]:
    """Lines defining the terms and every column present."""
    return ["definitions:"] + [f"  {k}: {v}" for k, v in definitions(columns, terms).items()]


def view_figures(*views: str) -> list[str]:
    """The figures the views print, in the table's order."""
    return [f.name for f in _RECORDS if set(views) & set(f.views)]


def help_text(*views: str) -> str:
    """A `--help` epilog: the figures of the views (every view by default) with their units, the
    report's terms first."""
    views = views or tuple(dict.fromkeys(v for f in _RECORDS for v in f.views))
    names = [n for n in view_figures(*views) if n not in TERMS]
    width = max(len(n) for n in names)
    terms = [f"  {k}: {v}" for k, v in definitions_of(TERMS).items()] if REPORT in views else []
    return "\n".join(["definitions:"] + terms + (["columns (unit, what it counts):"] if terms else [])
                     + [f"  {n:<{width}}  {FIGURES[n].unit or '-':<5}  {FIGURES[n].definition}"
                        for n in names])
