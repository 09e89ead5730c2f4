"""`partui bench WHAT [ARGS]`: the benchmarks against torch built-ins (partui/bench/WHAT.py)."""
from __future__ import annotations

import argparse
import importlib

BENCHES = ("step", "launch", "dp", "tp", "pp", "cp", "ep", "fb", "collectives", "trace", "app", "whatif",
           "soak", "analysis", "blame", "blame-scale", "checkpoint", "flight")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("bench", help="benchmarks against torch built-ins")
    p.add_argument("what", choices=BENCHES)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the bench's own flags (--help)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    # a dispatch table: only the bench asked for is imported (each brings its own heavy peers)
    return importlib.import_module(f"partui.bench.{args.what.replace('-', '_')}").main(args.rest)
