"""`partui` / `partui app`: the terminal app (partui.app)."""
from __future__ import annotations

import argparse

from partui.app.main import main as app_main


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("app", help="the terminal app (same as no arguments)")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    return app_main()
