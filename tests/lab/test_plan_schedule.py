"""One Plan-to-schedule step (planning.pipeline.schedules.plan_schedule): the schedule the report simulates for a
recorded 1F1B --fb-overlap trace is the one its executor ran, action for action."""
import re

from conftest import run_here
from planning.pipeline.actions import COMPUTE_KINDS
from planning.pipeline.catalog import build_schedule
from partui.analysis import load
from partui.analysis.figures.pipeline import pp_coord, trace_schedule
from partui.analysis.figures.timing import actions

SPAN = re.compile(r"^(F|BW|B|W|FB) mb(\d+) c(\d+)(?: / mb(\d+) c(\d+))?$")   # an executor action's span


def _key(kind, mb, chunk, mb2=None, chunk2=None):
    return (kind, int(mb), int(chunk)) + ((int(mb2), int(chunk2)) if kind == "FB" else ())


def _scheduled(schedule, pp_rank):
    return [_key(a.kind, a.mb, a.chunk, a.mb2, a.chunk2) for a in schedule.actions[pp_rank]
            if a.kind in COMPUTE_KINDS]


def test_the_report_simulates_the_schedule_the_executor_ran(tmp_path):
    path = tmp_path / "fb.json"
    proc = run_here("run", "--pp", 2, "--ep", 2, "--experts", 4, "--schedule", "1f1b", "--microbatches", 4,
                   "--fb-overlap", "--steps", 1, "--trace", path)
    assert proc.returncode == 0, proc.stderr
    df = load(str(path))
    coords = df.attrs["metadata"]["coords"]
    spans = actions(df).sort_values(["rank", "ts"])
    ran = {}                                    # global rank -> its executed actions, in order
    for rank, name in zip(spans["rank"], spans["name"]):
        m = SPAN.match(str(name))               # the pair's inner parts (ATTN F mb3 L0 ...) are not actions
        if m:
            ran.setdefault(int(rank), []).append(_key(*m.groups()))
    schedule = trace_schedule(df)[0]
    assert len(ran) == 4
    for rank, executed in ran.items():
        assert executed == _scheduled(schedule, pp_coord(coords[str(rank)], rank)), rank
    assert any(a[0] == "FB" for a in ran[0])    # the pairs ran; a schedule without them cannot match
    plain = build_schedule("1f1b", 2, 4)
    assert _scheduled(plain, 0) != ran[0]
