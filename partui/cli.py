"""partui: the app (no arguments), and `run`, `plan`, `report`, `simulate`, `whatif`, `blame`,
`bench`, `repl` headless."""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

# subcommand -> (module with add_parser(subparsers) and run(args), help). A dispatch table: only the
# module of the command given is imported, so `partui report` never imports torch, `partui run`
# never imports pandas or textual, and `partui --help` imports neither.
COMMANDS = {
    "run": ("partui.commands.run", "train headless on a gloo world (or under torchrun)"),
    "plan": ("partui.commands.plan", "every rank's groups, shards and memory, without launching"),
    "report": ("partui.commands.report", "overlap / bubble report of a recorded trace"),
    "simulate": ("partui.commands.simulate", "simulate a pipeline schedule: timeline, bubble, formula"),
    "whatif": ("partui.commands.whatif", "predict a recorded plan's step under an emulated link"),
    "blame": ("partui.commands.blame", "stragglers: the cross-rank critical path and what each rank cost"),
    "doctor": ("partui.commands.doctor", "which collective hung, on which rank, and why (a flight dump)"),
    "bench": ("partui.commands.bench", "benchmarks against torch built-ins"),
    "repl": ("partui.commands.repl", "a Python REPL holding a live world"),
    "app": ("partui.commands.app", "the terminal app (same as no arguments)"),
}


def build_parser(command: str | None = None, parsers: dict | None = None) -> argparse.ArgumentParser:
    """The parser, with the full subparser of `command` (its module imported) and the others named;
    `parsers` (when given) receives name -> subparser."""
    ap = argparse.ArgumentParser(prog="partui", description=__doc__)
    ap.add_argument("--version", action=VersionAction)
    sub = ap.add_subparsers(dest="cmd")
    for name, (module, help_text) in COMMANDS.items():
        if name == command:
            parser = importlib.import_module(module).add_parser(sub)
        else:
            parser = sub.add_parser(name, help=help_text, add_help=False)
        if parsers is not None:
            parsers[name] = parser
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    argv = joined_negatives(argv or ["app"])
    command = next((a for a in argv if not a.startswith("-")), None)
    parsers: dict = {}
    args, unknown = build_parser(command if command in COMMANDS else None,
                                 parsers).parse_known_args(argv)
    if args.cmd is None:          # flags with no command: name them, not the whole help
        what = f"unrecognized arguments: {' '.join(unknown)}" if unknown else "name a command"
        print(f"partui: error: {what}; the commands: {', '.join(COMMANDS)} (partui --help; "
              f"partui run --help)", file=sys.stderr)
        return 2
    if unknown:                   # the command's own usage, not the top level's (exits 2)
        parsers[args.cmd].error(f"unrecognized arguments: {' '.join(unknown)}")
    args.argv = argv              # the command as given (a trace records it), not this process's
    try:
        code = args.func(args)
        sys.stdout.flush()        # the last buffered lines: a closed pipe raises here, not at exit
        return code
    except KeyboardInterrupt:     # Ctrl-C: the command's `with` blocks have closed its world
        print(f"partui {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:       # `partui ... | head`: the reader has what it wanted
        quiet_stdout()
        return 0


NEGATIVE = re.compile(r"-(\d|\.\d|inf|nan|infinity)", re.IGNORECASE)


def joined_negatives(argv: list[str]) -> list[str]:
    """`--lr -inf`, `--trace-steps -1:2` as `--lr=-inf`: argparse takes a value that starts with '-'
    and is not a plain negative number for a flag, and answers "expected one argument" without
    saying what is wrong with the value; joined, the flag's own check names it."""
    out: list[str] = []
    for word in argv:
        if (out and out[-1].startswith("--") and "=" not in out[-1] and NEGATIVE.match(word)):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


class VersionAction(argparse.Action):
    """argparse's version action, the version looked up only when asked: importlib.metadata costs ~30 ms
    of every start (a third of what `partui report` on a GPU trace is allowed)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show program's version number and exit"):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"partui {version()}")
        parser.exit()


def version() -> str:
    """The installed distribution's version (pyproject.toml's), or say it is not installed."""
    from importlib.metadata import PackageNotFoundError, version as dist_version
    try:
        return dist_version("partui")
    except PackageNotFoundError:
        return "(not installed: pip install -e . in the checkout)"


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush at exit cannot raise on the closed
    pipe again (the fd is replaced, not closed: it stays valid until exit)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):   # stdout is not a real file (captured in a test)
        pass


if __name__ == "__main__":
    sys.exit(main())
