"""`partui run`'s checkpoint flags: --save DIR [--save-every N] [--keep K] and --resume DIR, checked
before anything launches (a checkpoint the plan cannot take: exit 2, one line), and the saver that
checkpoints between steps and names the last good checkpoint when a run ends badly."""
from __future__ import annotations

import os
import shlex
import sys

from partui.checkpoints.checkpoint import check_resume, saved_steps
from partui.commands.paths import prove_writable


def add_checkpoint_arguments(p) -> None:
    g = p.add_argument_group("checkpoints (torch DCP: save under one plan, resume under any)")
    g.add_argument("--save", default=None, metavar="DIR",
                   help="checkpoint into DIR/step-NNNNNNNN at the end (and every --save-every "
                        "steps); each rank writes its own shards, committed once all have")
    g.add_argument("--save-every", type=int, default=0, metavar="N",
                   help="with --save: also checkpoint after every N steps")
    g.add_argument("--keep", type=int, default=0, metavar="K",
                   help="with --save: keep the newest K checkpoints in DIR (default all)")
    g.add_argument("--resume", default=None, metavar="DIR",
                   help="start from a checkpoint (a step-* folder, or a --save DIR: its newest), "
                        "saved under any plan; --steps N runs N more, numbered on; --steps 0 "
                        "--save DIR2 reshards it with no step")


def check_checkpoint_options(args, world) -> None:
    """ValueError (CheckpointError too) for checkpoint flags that cannot work; before launch."""
    if args.save_every < 0 or args.keep < 0:
        bad = "--save-every" if args.save_every < 0 else "--keep"
        raise ValueError(f"{bad} {getattr(args, bad[2:].replace('-', '_'))} must be >= 1 "
                         f"(0: off); try {bad} 2")
    if (args.save_every or args.keep) and not args.save:
        bad = "--save-every" if args.save_every else "--keep"
        raise ValueError(f"{bad} needs --save DIR: where the checkpoints go (e.g. --save ckpt/)")
    if args.steps == 0 and not (args.resume and args.save):
        raise ValueError("--steps 0 runs no step: only with --resume DIR --save DIR2 (a reshard); "
                         "otherwise try --steps 5")
    if args.save:
        prove_writable(os.path.abspath(args.save), f"--save {args.save}", "--save ckpt/",
                       create=True)
    if args.resume:
        args.resume_from, _ = check_resume(args.resume, world.current_plan, world.cfg,
                                           world.training())


class Saver:
    """Checkpoints the world after every --save-every steps and at the end; remembers the last."""

    def __init__(self, world, args):
        self.world, self.args = world, args
        self.last: str | None = getattr(args, "resume_from", None)
        self.last_step = None

    def after(self, line: dict) -> None:
        every = self.args.save_every
        if self.args.save and every and (line["step"] + 1) % every == 0:
            self.save(line["step"] + 1)

    def save(self, step: int | None = None) -> None:
        self.last = self.world.save(self.args.save, keep=self.args.keep or None)
        self.last_step = step
        print(f"partui run: checkpoint {self.last}", file=sys.stderr, flush=True)

    def finish(self, steps_done: int | None) -> None:
        """The end-of-run checkpoint, unless the last step was just saved."""
        if self.args.save and (steps_done is None or steps_done != self.last_step):
            self.save(steps_done)

    def hint(self) -> str:
        """After a bad end: the last good checkpoint and the command that resumes it."""
        last = self.last
        if last is None and self.args.save and saved_steps(self.args.save):
            last = saved_steps(self.args.save)[-1]        # an earlier run's, in the same root
        if not last:
            return "no checkpoint was saved (add --save DIR --save-every N to keep progress)"
        argv = list(self.args.argv)
        while "--resume" in argv:
            i = argv.index("--resume")
            del argv[i:i + 2]
        return (f"last checkpoint {last}; resume with: partui "
                f"{shlex.join(argv + ['--resume', last])}")
