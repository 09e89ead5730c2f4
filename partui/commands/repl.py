"""`partui repl`: a Python REPL holding a World (partui.world.world) with the app's verbs."""
from __future__ import annotations

import argparse
import code

from partui.world.plans import PRESETS
from partui.world.world import World

BANNER = """partui repl: `w` is a partui.World (the same object the app and `partui run` drive).
Try, in order:
  w.plan("zero2", dp=2)     validate a plan (presets: {presets})
  w.launch()                start the ranks
  w.step(3)                 three steps: a table of step, loss, step_ms, compute, comm, overlap
  w.show(1, "optim")        rank 1's AdamW state: name, piece, optimizer_steps, m / v norms
  w.show(1, "grad", "wq")   rank 1's gradient pieces of the parameters matching "wq"
  w.step(3).to_pandas()     any table as a pandas DataFrame (w.show(...).to_pandas() too)
  w.trace_on(); w.step(); w.trace_save("demo"); w.report()      overlap table (pandas)
  w.summary()               what `partui run` prints last
  w.close()                 (also done on exit: ctrl+d)
World(check=True) holds every step to the single-process reference."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("repl", help="a Python REPL holding a live world")
    p.set_defaults(func=run)
    return p


def run(args=None) -> int:
    try:
        import readline  # optional: not every Python has it
        import rlcompleter  # noqa: F401 - tab completes names and attributes
        readline.parse_and_bind("tab: complete")
    except ImportError:
        pass
    w = World()
    try:
        code.interact(banner=BANNER.format(presets=", ".join(PRESETS)),
                      local={"w": w, "World": World}, exitmsg="closing the world")
    finally:
        w.close()
    return 0
