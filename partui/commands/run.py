"""`partui run`: train a plan headless through partui.World, optionally checked against the reference
and traced; one line per step (`--json`: one JSON object) and a summary. Exit 2 on a bad plan or
flags (one line on stderr, in flags), 1 on a rank failure or a failed check."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

from partui.commands.fault_flags import (
    add_flight_arguments,
    check_flight_options,
    flight_options,
)
from partui.commands.flags import (
    add_run_arguments,
    fields_from_args,
    flagify,
    microbatches_note,
    world_options,
)
from partui.commands.paths import check_output_file, prove_writable
from partui.commands.resume import Saver, add_checkpoint_arguments, check_checkpoint_options
from partui.world.launch import RankError, WorldTimeout
from partui.recording.machine import under_torchrun, usable_cpus
from partui.world.results import line_text, public, summary_text
from partui.world.world import World


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("run", help="train headless on a gloo world (or under torchrun)")
    add_run_arguments(p)
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="record every rank with torch.profiler into DIR/rank-N.json (Kineto: "
                        "`partui report DIR`, HTA, Perfetto); created if missing")
    p.add_argument("--critical-path", action="store_true",
                   help="with --trace: mark the slowest step's critical path across ranks in the "
                        "saved trace (partui blame's; args.critical_path and one flow chain, for "
                        "Perfetto)")
    add_checkpoint_arguments(p)
    add_flight_arguments(p)
    p.set_defaults(func=run)
    return p


def fail(msg: str, code: int = 2) -> int:
    print(f"partui run: {msg}", file=sys.stderr)
    return code


def parse_steps(spec: str | None, steps: int) -> set[int]:
    if not spec:
        return set(range(steps))
    try:
        a, _, b = spec.partition(":")
        lo, hi = int(a or 0), int(b) if b else int(a) + 1
    except ValueError:
        raise ValueError(f"--trace-steps {spec!r} is not START:STOP (e.g. 2:4)")
    if not (0 <= lo < hi <= steps):
        raise ValueError(f"--trace-steps {spec!r} is outside steps 0..{steps}: pick START < STOP "
                         f"<= {steps}")
    return set(range(lo, hi))


def check_run_options(args) -> None:
    """The flags that are not plan fields, refused before anything launches."""
    rpn = args.ranks_per_node
    if rpn is not None and rpn < 1:       # before World(), which checks it against no world yet
        raise ValueError(f"--ranks-per-node {rpn}: ranks on one node are 1 or more (a divisor of "
                         f"the world); leave it out for one node, or e.g. --ranks-per-node 2")
    if args.steps < 1 and not (args.steps == 0 and args.resume):
        raise ValueError(f"--steps {args.steps}: a run takes 1 step or more; try --steps 5")
    if not (args.timeout > 0 and math.isfinite(args.timeout)):
        raise ValueError(f"--timeout {args.timeout:g}: seconds any command may take must be > 0; "
                         f"try --timeout 120")
    if args.critical_path and not args.trace:
        raise ValueError("--critical-path marks the saved trace: add --trace PATH (e.g. --trace "
                         "run.json.gz --critical-path)")


TRACE_CAP_STEPS = 50   # a ring of the last steps: a long run's trace stays a size Perfetto opens


def cap_trace_steps(steps: set[int], uncapped: bool) -> set[int]:
    """The last TRACE_CAP_STEPS of the steps to trace (all of them when uncapped)."""
    if uncapped or len(steps) <= TRACE_CAP_STEPS:
        return steps
    return set(sorted(steps)[-TRACE_CAP_STEPS:])


def trace_size_warning(asked: set[int], kept: set[int], at: int, events: int, nbytes: int) -> str:
    """The warning for a trace of more than TRACE_CAP_STEPS steps: its expected size, events a
    step (measured: every rank's events of step `at`, and their JSON bytes) x steps, and the cap."""
    def size(n: int) -> str:
        return f"about {events * n:,} events, {nbytes * n / 1e6:.1f} MB of JSON"
    head = (f"partui run: warning: tracing {len(asked)} steps is {size(len(asked))} "
            f"({events:,} events a step on step {at}, every rank)")
    if kept == asked:
        return f"{head}; --trace-uncapped records all of it"
    return (f"{head}; recording the last {len(kept)} (steps {min(kept)}:{max(kept) + 1}, "
            f"{size(len(kept))}); --trace-uncapped records all {len(asked)}")


def traced_run(world: World, steps: int, asked: set[int], kept: set[int], sparse: bool,
               print_line) -> None:
    """world.run with `kept` traced. When more than the cap is asked, the first asked step is
    traced alone first (kept or not) to measure a step's events, and the warning names the size."""
    if len(asked) <= TRACE_CAP_STEPS:
        run_fetching(world, steps, print_line, kept, sparse)
        return
    at = min(asked)
    world.run(at, on_step=print_line)
    world.trace_on(sparse)
    world.run(1, on_step=print_line)
    window = world.trace_off(keep=at in kept)
    evs = [e for rank in window for e in rank["events"]]
    print(trace_size_warning(asked, kept, at, len(evs), len(json.dumps(evs))), file=sys.stderr,
          flush=True)
    run_fetching(world, steps - at - 1, print_line, kept, sparse)


def run_fetching(world: World, steps: int, print_line, kept: set[int], sparse: bool) -> None:
    """world.run with each traced step fetched from the ranks as it ends (a window a step), so a
    run that ends badly still holds every step traced so far for the partial file."""
    if not kept:
        world.run(steps, on_step=print_line)
        return
    for _ in range(steps):
        at = world.steps_done
        world.run(1, on_step=print_line, trace_steps={at} & kept, sparse=sparse)


def partial_path(path: str) -> str:
    """NAME.partial.json (or .json.gz) beside the asked NAME.json: where a bad end saves."""
    base, ext = (path[:-8], ".json.gz") if path.endswith(".json.gz") else os.path.splitext(path)
    return f"{base}.partial{ext}"


def save_partial(world: World, path: str, command: str, why: str) -> None:
    """The steps already fetched, saved to NAME.partial.json (never over the asked path); one line
    on stderr naming the file, or why it could not be written."""
    partial = partial_path(path)
    if not world.recorded_steps():
        print(f"partui run: {why}: no traced step had finished; nothing saved (not {path})",
              file=sys.stderr, flush=True)
        return
    try:
        steps = world.recorded_steps()
        world.trace_save(partial, command=command + "  # partial: " + why, fetched_only=True)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"partui run: {why}; the traced steps could not be saved to {partial} either: {e}",
              file=sys.stderr, flush=True)
        return
    print(f"partui run: {why}: the {len(steps)} traced step{'s' if len(steps) != 1 else ''} "
          f"done ({min(steps)}:{max(steps) + 1}) are in {partial}; {path} was not written",
          file=sys.stderr, flush=True)


def check_trace_path(path: str) -> None:
    """Refuse, before anything launches, a trace path the save at the end could not write."""
    check_output_file(path, "--trace", (".json", ".json.gz"), "traces/run.json")


def check_profile_dir(folder: str) -> str:
    """Create `folder` if needed and prove it writable, before anything launches; ValueError naming
    the folder and a fix otherwise. Returns its absolute path."""
    path = os.path.abspath(folder)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--profile {folder} is a file: --profile takes a folder (one "
                         f"torch.profiler trace per rank, DIR/rank-N.json), e.g. --profile traces/prof/")
    prove_writable(path, f"--profile {folder}", "--profile traces/prof/", create=True)
    return path


def run(args) -> int:
    try:
        check_run_options(args)
        world = World(**world_options(args), **flight_options(args))
        world.plan("custom", args.model, **fields_from_args(args))
        check_flight_options(args, world.current_plan.world)
        asked = parse_steps(args.trace_steps, args.steps) if args.trace else set()
        if args.trace:
            check_trace_path(args.trace)
        if args.profile:
            args.profile = check_profile_dir(args.profile)
        trace_steps = cap_trace_steps(asked, args.trace_uncapped)
        check_checkpoint_options(args, world)        # a checkpoint it cannot take: before launch
    except ValueError as e:                       # PlanError too: one line, in flags
        return fail(flagify(str(e)))
    if args.trace_steps and not args.trace:
        print(f"partui run: warning: --trace-steps {args.trace_steps} without --trace records "
              f"nothing; add --trace traces/run.json", file=sys.stderr)
    cpus = usable_cpus()
    if world.current_plan.world > cpus:
        print(f"partui run: warning: world {world.current_plan.world} puts "
              f"{world.current_plan.world} rank processes on {cpus} usable CPU(s), "
              f"{world.current_plan.world / cpus:.1f} ranks a core: steps run that much slower "
              f"(and timeouts come sooner)", file=sys.stderr)
    print_line = (lambda ln: print(json.dumps(public(ln)), flush=True)) if args.json else \
        (lambda ln: print(line_text(ln), flush=True))
    # torch loads only once every flag is accepted: a refusal answers in a fraction of a second
    from kernels.comm import RendezvousError
    from partui.world.torchrun import run_joined
    if under_torchrun():
        if args.link:
            return fail("--link emulates links between ranks sharing this host's clock; run "
                        "without torchrun (partui run --link ...)")
        if args.check or args.trace:
            return fail("--check and --trace gather every rank's pieces through partui's own "
                        "controller; run them without torchrun (partui run --check ...)")
        try:
            summary = run_joined(world, args.steps, print_line, profile=args.profile,
                                 resume=getattr(args, "resume_from", None), save=args.save,
                                 keep=args.keep or None)
        except ValueError as e:
            return fail(str(e))
        except RendezvousError as e:                   # most often: the rendezvous port is taken
            return fail(port_in_use_text(e), 1)
        if summary is not None:
            print_summary(summary, world, args.json, microbatches_note(args, world.current_plan))
        return 0
    command = "partui " + " ".join(args.argv)
    saver = Saver(world, args)
    try:
        with world:
            world.launch()
            if args.resume:
                print(f"partui run: resumed {args.resume_from} at step {world.load(args.resume_from)}",
                      file=sys.stderr, flush=True)
            if args.steps == 0:                    # a reshard: load under this plan, save, no step
                saver.finish(None)
                return 0
            if args.profile:
                world.profile(args.profile)
            try:
                traced_run(world, args.steps, asked, trace_steps, not args.trace_full,
                           lambda ln: (print_line(ln), saver.after(ln)))
                if args.save:
                    saver.finish(world.history[-1]["step"] + 1)
                if args.trace:
                    world.trace_save(args.trace, command=command)
                    if args.critical_path:   # pandas and the analysis: only a marked trace
                        from partui.analysis.replay.blame_marks import mark_trace
                        print(f"partui run: {mark_trace(args.trace)}", file=sys.stderr, flush=True)
            except BaseException as e:            # a rank died or stopped, Ctrl-C, a save error
                if args.trace:
                    save_partial(world, args.trace, command, bad_end(e))
                raise
            if args.profile:
                say_profiled(world.profile(None))
            if args.fault:                    # the run survived its fault: what the recorder saw
                print(world.doctor(f"end of run with --fault {args.fault}"), file=sys.stderr)
            summary = world.summary()
    except (RankError, WorldTimeout) as e:
        return fail(f"{e}\n{getattr(e, 'traceback', '')}".rstrip() +
                    (f"\npartui run: {saver.hint()}" if args.save or args.resume else ""), 1)
    except OSError as e:                          # the save itself (the partial line said where)
        if isinstance(e, BrokenPipeError):
            raise
        return fail(f"--trace {args.trace} could not be saved: {e}", 1)
    print_summary(summary, world, args.json, microbatches_note(args, world.current_plan))
    return 1 if world.failed else 0


def say_profiled(paths: list[str]) -> None:
    if paths:
        print(f"partui run: profile: {len(paths)} rank file(s) in {os.path.dirname(paths[0])} "
              f"(partui report {os.path.dirname(paths[0])})", file=sys.stderr, flush=True)


def port_in_use_text(e: Exception) -> str:
    """The one line for torchrun's rendezvous failing to listen or connect (DistNetworkError)."""
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return (f"torchrun's rendezvous at {where} failed ({first[:160]}): the port is most likely in "
            f"use by another torchrun or world; pick a free one (torchrun --master-port N, or "
            f"--standalone for one machine)")


def bad_end(e: BaseException) -> str:
    """How a traced run ended badly, in a few words for the partial file's line."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    if isinstance(e, (RankError, WorldTimeout)):
        return "the world failed"
    if isinstance(e, BrokenPipeError):
        return "the output pipe closed"
    return f"the save failed ({type(e).__name__})" if isinstance(e, OSError) else type(e).__name__


def print_summary(summary: dict, world: World, as_json: bool, note: str = "") -> None:
    if as_json:
        print(json.dumps({"summary": {**summary, "defaults": note} if note else summary}), flush=True)
        return
    describe = world.current_plan.describe() + (f" · {note}" if note else "")
    print(summary_text(summary, describe), flush=True)
