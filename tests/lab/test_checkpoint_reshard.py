"""Across plans: a checkpoint saved under each plan loads under every other plan of its model, and
saved again at once (no step) it is the same checkpoint: both through dcp_to_torch_save, every
tensor bitwise equal. Then the resumed plan's next step passes --check against the reference
resumed from the same checkpoint.

Cost: one world per plan saves (one step first, so AdamW's state and DeepSeek's bias are not
their initial zeros), and one world per plan loads every other plan's checkpoint in turn, each
load followed by its save: 2 x 17 worlds for the 17 x 16 reshards of the full matrix. A world per
reshard (272 of them, ~5 s each here on 2 loaded cores) would take over 20 minutes."""
import pytest

from tests.lab.checkpoint_helpers import DEEPSEEK, DENSE, GSHARD, differences, whole_state, world

GROUPS = {"dense": DENSE, "gshard": GSHARD, "deepseek": DEEPSEEK}
CASES = [(g, t) for g, plans in GROUPS.items() for t in plans]
_saved: dict[str, dict[str, str]] = {}


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
    sources = {s: p for s, p in saved(group).items() if s != target}
    with world(target, check=True) as w:
        for source, ckpt in sources.items():
            assert w.load(ckpt) == 1
            again = w.save(str(tmp_path / f"{source}-as-{target}"))
            bad = differences(whole_state(ckpt, str(tmp_path)), whole_state(again, str(tmp_path)))
            assert bad == [], f"{source} -> {target}: {bad[:5]}"
        line = w.step(1)[0]            # resumed from the last source: held to its reference
        assert line["step"] == 1 and "check" not in line, line.get("check")
