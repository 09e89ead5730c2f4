"""argparse types the benches share, torch-free so a bad flag is refused before a world or torch
loads: counts (a whole number >= 1, the error naming the flag and a fix) and model preset lists."""
from __future__ import annotations

import argparse

from planning.config import PRESETS


def whole_at_least_one(flag: str, example: int):
    """argparse type for a count flag: a whole number >= 1, the error naming the flag and a fix."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: e.g. {flag} {example}") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{n} must be >= 1: e.g. {flag} {example}")
        return n
    return parse


def model_names(text: str) -> list[str]:
    """argparse type for `tiny,small`: model presets, each one planning.config knows."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PRESETS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown model preset(s) {', '.join(unknown) or repr(text)}: "
                                         f"pick from {', '.join(PRESETS)} (comma-separated)")
    return names
