"""`partui doctor DUMP`: the flight recorder's verdict on a dump written by `partui run` (on a hang,
a rank's failure, or after a --fault run) or on torch's own flight recorder dumps (the
TORCH_FR_DUMP_TEMP_FILE prefix, or a folder of them): the op the world stopped in, who entered it
and who did not, where each missing rank was, any mismatch with both sides."""
from __future__ import annotations

import argparse
import json
import sys

from partui.diagnosis.doctor import render, verdict
from partui.diagnosis.fr_merge import merge
from partui.diagnosis.torch_fr import is_torch_dump, to_dump


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("doctor", help="which collective hung, on which rank, and why: the "
                                             "verdict on a flight recorder dump")
    p.add_argument("dump", help="a partui flight dump (.json: partui run --flight-dump) or torch's "
                                "flight recorder dumps (their TORCH_FR_DUMP_TEMP_FILE prefix or folder)")
    p.add_argument("--with", dest="with_dump", default=None, metavar="PARTUI_DUMP",
                   help="with torch's dumps: partui's dump of the same run (partui run under "
                        "torchrun writes both), for what torch's lack under gloo (p2p ops, group "
                        "members, where each rank waits, a rank that left no dump); the verdict "
                        "names the source of each")
    p.add_argument("--json", action="store_true", help="the verdict as one JSON object")
    p.set_defaults(func=run)
    return p


def load(path: str) -> dict:
    """A partui dump or torch's, as partui's dump shape; ValueError naming the problem."""
    try:
        if path.endswith(".json"):
            with open(path) as f:
                doc = json.load(f)
            if doc.get("format") != "partui-flight":
                raise ValueError(f"{path} is JSON but not a partui flight dump (no \"format\": "
                                 f"\"partui-flight\"): give the file partui run wrote")
            return doc
        if is_torch_dump(path):
            return to_dump(path)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} cannot be read ({e}): give a dump partui run or torch wrote")
    raise ValueError(f"{path} is neither a partui flight dump (.json) nor torch flight recorder "
                     f"dumps (TORCH_FR_DUMP_TEMP_FILE prefix): give one of those")


def run(args) -> int:
    try:
        dump = load(args.dump)
        if args.with_dump:
            ours = load(args.with_dump)
            if dump.get("format") != "torch-fr" or ours.get("format") != "partui-flight":
                raise ValueError(f"--with {args.with_dump}: give torch's dumps first and partui's "
                                 f"dump after --with (partui doctor TORCH_PREFIX --with "
                                 f"partui.json)")
            dump = merge(dump, ours)
    except ValueError as e:
        print(f"partui doctor: {e}", file=sys.stderr)
        return 2
    v = verdict(dump)
    if args.json:
        print(json.dumps(v))
    else:
        print("\n".join(render(v)))
    return 0 if v["headline"]["kind"] == "ok" else 1
