"""`partui run`'s flight recorder flags: --fault KIND@STEP:RANK (a fault on purpose, refused before
launch when it cannot be), --validate-comms (on with --check) and --flight-dump PATH (where a
gathered dump goes: on a hang or a rank's failure, and at the end of a run with --fault)."""
from __future__ import annotations

import os
import tempfile

from partui.commands.paths import check_output_file
from planning.fault_spec import EXAMPLE, KINDS, parse_fault


def add_flight_arguments(p) -> None:
    g = p.add_argument_group("flight recorder")
    g.add_argument("--fault", default="", metavar="KIND@STEP:RANK",
                   help=f"a fault on purpose: rank RANK misbehaves once at step STEP ({EXAMPLE}): "
                        + "; ".join(f"{k}: {v}" for k, v in KINDS.items()))
    g.add_argument("--validate-comms", action="store_true",
                   help="compare each collective's op, sizes and dtypes across its group before "
                        "it runs (on with --check); a mismatch fails at once naming both ranks")
    g.add_argument("--flight-dump", default=None, metavar="PATH",
                   help="where the flight recorder's dump goes on a hang or failure, and after a "
                        "--fault run (default: a file in the temp folder, named when written); "
                        "read it later with partui doctor PATH")


def flight_options(args) -> dict:
    """World's flight recorder options from the command line."""
    path = args.flight_dump or os.path.join(tempfile.gettempdir(), f"partui-flight-{os.getpid()}.json")
    return {"validate_comms": args.validate_comms, "fault": args.fault, "flight_dump": path}


def check_flight_options(args, world: int) -> None:
    """Refuse a --fault that cannot be and a --flight-dump that cannot be written, before launch."""
    parse_fault(args.fault, world, args.steps)
    if args.flight_dump:
        check_output_file(args.flight_dump, "--flight-dump", (".json",), "traces/flight.json")
