"""Step lines and the run summary, from every rank's step summaries: what `partui run --json` prints,
what World.step returns and the app draws, the same under torchrun. Plain data; light to import.

A step line: step, loss (rank 0's: the global loss), step_ms (the slowest rank's), ranks (per rank
window (its own step) / compute / comm / overlapped / exposed comm / wait ms: planning.intervals, the terms of
partui.analysis.figures.definitions, what `partui report` counts on a trace of the step, p2p pairs
matched across ranks here), grad_sync_overlap (mean), attn_* (per rank), moe_layers (the
routing observatory: per MoE layer, gathered over dp inside the step, each layer taken once from
the ranks holding it, so tp never multiplies it) and its moe_* totals, with a check: ref_loss and max_abs_{loss,grad,param}_err,
max_rel_{grad,param}_err, bf16: grad_noise_ratio; check when it failed.
`memory` (per rank: the step's peak, the action at it, each kind then, each kind's own peak;
kernels/memory.py). `ledgers` (one memory ledger per rank) rides along for the summary and the app; `public()` drops it.
"""
from __future__ import annotations

from planning.intervals import MS_NAMES, in_ms, pair_p2p, parts_figures
from planning.routing_figures import merge_layers, routing_totals

FIGURE_KEYS = tuple(MS_NAMES)   # compute, comm, overlapped, exposed comm, wait (ms)
RANK_KEYS = ("window_ms",) + FIGURE_KEYS   # a rank's own step: window_ms (step_ms is the line's)
MEAN_KEYS = ("grad_sync_overlap",)
PER_RANK_KEYS = ("attn_ms", "attn_cpu_ms", "attn_flops", "attn_overlap_pct")  # cp load balance
CHECK_KEYS = ("max_abs_grad_err", "max_abs_loss_err", "max_abs_param_err", "max_rel_grad_err",
              "max_rel_param_err", "grad_noise_ratio")
PRIVATE_KEYS = ("ledgers",)


def pair_figures(items: list[dict]) -> None:
    """Each rank's figures again, in place, with its p2p ops paired to its peers' (the send's post
    to the recv's completion, planning.intervals.pair_p2p): what a trace of the step reports."""
    if not items or not all("figure_parts" in s for s in items):
        return
    paired = pair_p2p([s.get("p2p_ops") or [] for s in items])
    for s, p2p in zip(items, paired):
        s.update(in_ms(parts_figures(s["figure_parts"], p2p)))


def step_line(items: list[dict]) -> dict:
    """One step line from every rank's step summary (rank order)."""
    pair_figures(items)
    r0 = items[0]
    out = {"step": r0["step"], "loss": r0["loss"], "step_ms": max(s["step_ms"] for s in items),
           "ranks": [{k: round(s["step_ms" if k == "window_ms" else k], 3) for k in RANK_KEYS}
                     for s in items]}
    for key in MEAN_KEYS:
        vals = [s[key] for s in items if key in s]
        if vals:
            out[key] = sum(vals) / len(vals)
    for key in PER_RANK_KEYS:
        vals = [s[key] for s in items if key in s]
        if vals:
            out[key] = vals
    layers = merge_layers([s.get("moe_layers") for s in items])
    if layers:
        out["moe_layers"] = layers
        out.update(routing_totals(layers))
    if any("memory" in s for s in items):   # each rank's memory account (kernels/memory.py)
        out["memory"] = [s.get("memory") for s in items]
    out["ledgers"] = [s.get("ledger") for s in items]
    return out


def overlap_pct(item: dict) -> float | None:
    """overlapped_ms / comm_ms in % (the report's overlap_pct); None without comm."""
    return 100 * item["overlapped_ms"] / item["comm_ms"] if item.get("comm_ms") else None


def rank_figures(lines: list[dict]) -> tuple[list[dict], list[int]]:
    """Per rank, the mean of each step figure over the steps whose per-rank rows are kept (a World
    keeps the last one's: partui.world.world.past; the first step, a warm-up, left out when there are
    more), with its overlap_pct: the summary's `figures`; and those steps."""
    rows = [ln for ln in lines if "ranks" in ln]
    rows = rows[1:] or rows
    out = []
    for rank in range(len(rows[0]["ranks"]) if rows else 0):
        mean = {k: sum(ln["ranks"][rank][k] for ln in rows) / len(rows) for k in FIGURE_KEYS}
        out.append({"rank": rank, **{k: round(v, 3) for k, v in mean.items()},
                    "overlap_pct": overlap_pct(mean)})
    return out, [ln["step"] for ln in rows]


def public(line: dict) -> dict:
    """The line as `partui run --json` prints it."""
    return {k: v for k, v in line.items() if k not in PRIVATE_KEYS}


class StepTotals:
    """What the run summary needs from every step since launch, folded a line at a time: a World
    keeps only its last step lines (partui.world.world) and these, so its memory stays flat however long
    it runs. The first step, a warm-up, is held apart: the means leave it out when there are more."""

    def __init__(self):
        self.steps = 0
        self.first_loss: float | None = None
        self.first_ms: float | None = None
        self.later_ms_sum, self.later_steps = 0.0, 0     # step_ms of every step after the first
        self.failed = False                               # a checked step failed
        self.check_max: dict[str, float] = {}             # CHECK_KEYS: the worst of every step
        self.overlap_sum, self.overlap_steps = 0.0, 0     # grad_sync_overlap over every step
        self.first_per_rank: dict[str, list] = {}         # PER_RANK_KEYS of the first step
        self.later_per_rank: dict[str, tuple[list, int]] = {}   # per key: per-rank sums, steps
        self.memory_peak: list | None = None              # per rank, its highest step peak

    @classmethod
    def of(cls, lines: list[dict]) -> "StepTotals":
        totals = cls()
        for line in lines:
            totals.add(line)
        return totals

    def add(self, line: dict) -> None:
        first = self.steps == 0
        self.steps += 1
        if first:
            self.first_loss, self.first_ms = line["loss"], line["step_ms"]
        else:
            self.later_ms_sum += line["step_ms"]
            self.later_steps += 1
        self.failed = self.failed or "check" in line
        for key in CHECK_KEYS:
            if key in line:
                self.check_max[key] = max(self.check_max.get(key, line[key]), line[key])
        if "grad_sync_overlap" in line:
            self.overlap_sum += line["grad_sync_overlap"]
            self.overlap_steps += 1
        for key in PER_RANK_KEYS:
            if key not in line:
                continue
            if first:
                self.first_per_rank[key] = list(line[key])
            else:
                sums, n = self.later_per_rank.get(key, ([0.0] * len(line[key]), 0))
                self.later_per_rank[key] = ([a + b for a, b in zip(sums, line[key])], n + 1)
        if line.get("memory"):
            mem = line["memory"]
            self.memory_peak = list(mem) if self.memory_peak is None else [
                max(kept, new, key=lambda m: m["peak"]) for kept, new in zip(self.memory_peak, mem)]

    def mean_step_ms(self) -> float | None:
        if self.later_steps:
            return self.later_ms_sum / self.later_steps
        return self.first_ms

    def per_rank_means(self) -> dict[str, list[float]]:
        """Per PER_RANK_KEYS key, each rank's mean over the steps after the first (the first alone
        when it is the only step)."""
        per_key = ({k: (v, 1) for k, v in self.first_per_rank.items()} if self.steps == 1
                   else self.later_per_rank)
        return {k: [s / n for s in sums] for k, (sums, n) in per_key.items()}


def summarize(plan, cfg, infos: list[dict], lines: list[dict], launch_s: float,
              checked: bool = False, trace_path: str | None = None,
              totals: StepTotals | None = None) -> dict:
    """The run summary: plan, model, losses, mean step (the first step, a warm-up, left out),
    each rank's role and last ledger, the check's worst errors, overlap and cp load balance.
    `lines` are the last step lines (every one, or a World's kept ones); `totals` folds every step
    since launch (StepTotals.of(lines) when not given)."""
    totals = totals if totals is not None else StepTotals.of(lines)
    out = {"plan": plan.to_dict(), "model": cfg.to_dict(), "world": plan.world,
           "steps": totals.steps, "final_loss": lines[-1]["loss"] if lines else None,
           "first_loss": totals.first_loss,
           "mean_step_ms": totals.mean_step_ms(),
           "launch_s": round(launch_s, 3),
           "ranks": [{"rank": i["rank"], "label": i["label"], "role": i["role"],
                      "ledger": (lines[-1]["ledgers"][i["rank"]] if lines else i["ledger"])}
                     for i in infos]}
    if checked:
        out["check"] = "failed" if totals.failed else "passed"
        for key in CHECK_KEYS:
            out[key] = totals.check_max.get(key, 0.0)
    if totals.overlap_steps:
        out["grad_sync_overlap"] = totals.overlap_sum / totals.overlap_steps
    out.update(totals.per_rank_means())
    if "attn_cpu_ms" in out and min(out["attn_cpu_ms"]) > 0:
        out["attn_cpu_max_over_min"] = max(out["attn_cpu_ms"]) / min(out["attn_cpu_ms"])
    out["figures"], out["figures_steps"] = rank_figures(lines)
    out["figures_defined_by"] = "partui report --help (partui.analysis.figures.definitions)"
    if totals.memory_peak:   # per rank, its highest step peak: the total, the action at it and each kind then
        out["memory_peak"] = totals.memory_peak
    if trace_path:
        out["trace"] = trace_path
    return out


def summary_text(summary: dict, describe: str) -> str:
    """The line `partui run` prints at the end (without --json), then each rank's memory peak."""
    mean = summary["mean_step_ms"]
    return (f"{describe} · world {summary['world']} · {summary['steps']} step{'s' if summary['steps'] != 1 else ''} · final loss "
            f"{summary['final_loss']:.4f} · mean step {mean:.1f} ms"
            + (f" (steps 1-{summary['steps'] - 1}; step 0, the warm-up, left out)"
               if summary["steps"] > 1 else " (step 0, the only one)")
            + (f" · check {'FAILED' if summary['check'] == 'failed' else 'passed'}"
               if "check" in summary else "")
            + (f" · trace {summary['trace']}" if summary.get("trace") else "")
            + (f"\nlink: {summary['link']['describe']}" if summary.get("link") else "")
            + "".join(f"\n{memory_text(i, m)}" for i, m in memory_shown(summary)))


def memory_shown(summary: dict, most: int = 8) -> list:
    """(rank, its memory peak) for every rank; past `most` ranks only the highest (--json has all)."""
    peaks = list(enumerate(summary.get("memory_peak", [])))
    return peaks if len(peaks) <= most else [max(peaks, key=lambda p: p[1]["peak"])]


def memory_text(rank: int, peak: dict) -> str:
    """A rank's memory peak as `partui run` prints it: the total, the action at it, its kinds."""
    kinds = ", ".join(f"{k} {v / 2**20:.2f}" for k, v in peak["peak_kinds"].items() if v)
    return (f"memory rank {rank}: peak {peak['peak'] / 2**20:.2f} MiB at {peak['peak_at']} "
            f"({kinds}; {peak['peak_activation_entries']} microbatch contexts in flight at most)")


def line_text(line: dict) -> str:
    """A step line as `partui run` prints it (without --json)."""
    extra = ""
    if "max_abs_grad_err" in line:
        extra = (f"  loss err {line['max_abs_loss_err']:.2e}  grad err {line['max_abs_grad_err']:.2e}"
                 f"  param err {line['max_abs_param_err']:.2e}"
                 + (f"  {line['check']}" if "check" in line else ""))
    return f"step {line['step']:4d}  loss {line['loss']:.4f}  {line['step_ms']:8.1f} ms" + extra
