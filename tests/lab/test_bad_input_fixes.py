"""Every fix a plan refusal offers works (issue 35 item 8): the first fix of each `set ...` / `pick X
in ...` message of the bad-input tables, applied to the command as typed, is accepted by `partui
plan` (which validates the whole plan and its memory, launching nothing); and the fixes the issue
named by hand are rows of the tables (`--dp -1`, `--capacity-factor 0`, `--schedule` without `--pp`).
A fix may get past its own check onto a later one that names the next (planning.validate verifies
fixes two checks ahead): the chain of first fixes, followed, ends in a plan that is accepted."""
import re
import shlex

import pytest

from partui.commands.flags import SWITCHES
from test_bad_input import BAD_INPUTS
from test_bad_input_more import MORE_INPUTS, refusal

RUN_ONLY = ("--steps", "--timeout", "--trace", "--trace-steps", "--lr", "--weight-decay", "--optim",
            "--link", "--ranks-per-node", "--backward", "--reference", "--check", "--profile",
            "--critical-path", "--seed")
SWITCH_FLAGS = {"--" + s.replace("_", "-") for s in SWITCHES} | {"--check", "--json"}
PICK = re.compile(r"\bpick (--)?([a-z_-]+) in ([\w.-]+)")
SET = re.compile(r": set (.+?)(?: or |; | \(|$)")
WORD = re.compile(r"(and )?(no )?(--[a-z-]+)(?: (?!--)([\w.-]+))?")


def first_fix(line: str) -> list[tuple[str, str | None, bool]] | None:
    """The first alternative of a message's fix as (flag, value or None, drop it), or None when the
    message offers no flag fix (`pick a divisor of 2`, words only)."""
    pick = PICK.search(line)
    if pick:
        return [("--" + pick.group(2).replace("_", "-"), pick.group(3), False)]
    found = SET.search(line)
    if not found:
        return None
    return [(flag, value, bool(no)) for _, no, flag, value in WORD.findall(found.group(1))] or None


def applied(words: list[str], fix) -> list[str]:
    """words with each flag the fix names taken out (its value too), then the fix's own added."""
    named, out, i = {flag for flag, _, _ in fix}, [], 0
    while i < len(words):
        if words[i] in named:
            i += 1 if words[i] in SWITCH_FLAGS else 2
            continue
        out.append(words[i])
        i += 1
    for flag, value, drop in fix:
        if not drop:
            out += [flag] + ([value] if value is not None and flag not in SWITCH_FLAGS else [])
    return out


def plan_rows():
    """Rows of `plan`, or of `run` with plan flags only, whose message offers a flag fix."""
    for argv, _ in BAD_INPUTS + MORE_INPUTS:
        words = shlex.split(argv)
        if words[0] not in ("plan", "run") or any(w in RUN_ONLY for w in words):
            continue
        yield ["plan", *words[1:]]


# rows whose fix is a valid plan that this machine cannot hold: fixes are checked against the plan's
# rules (planning.validate), and the memory estimate then refuses the fixed plan with its own fix
CHAIN = 3        # planning.validate looks two fixes ahead (_valid's depth): one more than that
TOO_BIG = {"plan --batch 1000000007 --dp 3"}
ROWS = [w for w in plan_rows() if " ".join(w) not in TOO_BIG]


@pytest.mark.parametrize("words", ROWS, ids=[" ".join(w) for w in ROWS])
def test_the_first_fix_of_a_plan_refusal_is_a_plan_partui_accepts(words):
    rc, err, _ = refusal(shlex.join(words))
    line = err.strip().splitlines()[-1]
    fix = first_fix(line)
    if rc != 2 or fix is None:
        pytest.skip(f"no flag fix offered: {line}")
    fixed, said = words, [line]
    for _ in range(CHAIN):   # a fix may get past its check onto a next one whose own fix ends it
        fixed = applied(fixed, fix)
        again, err2, _ = refusal(shlex.join(fixed))
        if again == 0:
            return
        said.append(err2.strip().splitlines()[-1])
        fix = first_fix(said[-1])
        assert fix is not None, said
    pytest.fail(f"{' '.join(words)}: the fixes {said} end at {' '.join(fixed)}, still refused")
