"""Across plans: a checkpoint saved under each plan loads under every other plan of its model, and
saved again at once (no step) it is the same checkpoint: both through dcp_to_torch_save, every
tensor bitwise equal. Then the resumed plan's next step passes --check against the reference
resumed from the same checkpoint.

Cost: one world per plan saves (one step first, so AdamW's state and DeepSeek's bias are not
their initial zeros), and one world per plan loads other plans' checkpoints in turn, each load
followed by its save, so a world is launched 2 x 17 times whatever the matrix. Which sources a
target loads: by default a ring plus a hub (each group's first plan): the hub loads every other
plan of its model, every other plan loads the hub's and its ring predecessor's; so every plan is
saved-from and loaded-into, and each pair of plans is joined through the hub (39 reshards, 9 min on the
same loaded machine). PARTUI_CKPT_MATRIX=full loads every other plan into every plan (272 reshards: 16 min on
2 cores shared with 7 other jobs), for a change to the checkpoint code itself."""
import os

import pytest

from tests.lab.checkpoint_helpers import DEEPSEEK, DENSE, GSHARD, differences, whole_state, world

GROUPS = {"dense": DENSE, "gshard": GSHARD, "deepseek": DEEPSEEK}
CASES = [(g, t) for g, plans in GROUPS.items() for t in plans]
_saved: dict[str, dict[str, str]] = {}
_whole: dict[str, dict] = {}
FULL = os.environ.get("PARTUI_CKPT_MATRIX") == "full"


def sources_for(group: str, target: str) -> list[str]:
    """The plans whose checkpoints `target` loads (the ring plus hub, or every other)."""
    names = list(GROUPS[group])
    if FULL or target == names[0]:
        return [n for n in names if n != target]
    before = names[names.index(target) - 1]
    return sorted({names[0], before}, key=names.index)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """group -> {plan: its checkpoint} (made once per group, on first use)."""
    def of(group: str) -> dict[str, str]:
        if group not in _saved:
            root = tmp_path_factory.mktemp(f"src-{group}")
            out = {}
            for name in GROUPS[group]:
                with world(name) as w:
                    w.step(1)
                    out[name] = w.save(str(root / name))
            _saved[group] = out
        return _saved[group]
    return of


@pytest.mark.timeout(600)
@pytest.mark.parametrize("group,target", CASES, ids=[f"{g}-{t}" for g, t in CASES])
def test_every_other_plan_reshards_into_this_one_exactly(group, target, saved, tmp_path):
    ckpts = saved(group)
    with world(target, check=True) as w:
        for source in sources_for(group, target):
            ckpt = ckpts[source]
            assert w.load(ckpt) == 1
            again = w.save(str(tmp_path / f"{source}-as-{target}"))
            if ckpt not in _whole:
                _whole[ckpt] = whole_state(ckpt, str(tmp_path))
            bad = differences(_whole[ckpt], whole_state(again, str(tmp_path)))
            assert bad == [], f"{source} -> {target}: {bad[:5]}"
        line = w.step(1)[0]            # resumed from the last source: held to its reference
        assert line["step"] == 1 and "check" not in line, line.get("check")
