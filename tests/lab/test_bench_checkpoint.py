"""`partui bench checkpoint` runs its peer in the same world and counts bytes by hand: our payload
is the model and AdamW state exactly once over (params + m + v, fp32), FSDP2's the same plus its
per-param step scalars; a bad --plans is refused."""
import json
import math

import pytest

from conftest import run_here
from planning.config import make_config, param_shapes


@pytest.mark.timeout(400)
def test_the_bench_reports_both_and_writes_each_element_once():
    proc = run_here("bench", "checkpoint", "--model", "tiny", "--plans", "zero3,dualpipe",
                    "--rounds", 1, "--warmup", 0, "--json", check_rc=0)
    rows = {r["variant"]: r for r in json.loads(proc.stdout)["rows"]}
    once = sum(math.prod(s) for s in param_shapes(make_config("tiny")).values()) * 4 * 3
    assert set(rows) == {"zero3", "dualpipe", "fsdp2"}
    for v in ("zero3", "dualpipe"):
        assert rows[v]["payload"] == once and rows[v]["disk_bytes"] >= once
        assert rows[v]["save_s"] > 0 and rows[v]["load_s"] > 0
    n_params = len(param_shapes(make_config("tiny")))
    assert rows["fsdp2"]["payload"] == once + n_params * 4       # + AdamW's step per param
    assert rows["fsdp2"]["save/fsdp2"] == 1


def test_a_bad_plan_list_is_refused():
    proc = run_here("bench", "checkpoint", "--plans", "zero9")
    assert proc.returncode == 2 and "--plans" in proc.stderr
