"""`partui bench blame-scale`'s tiling: copies of a job side by side are a bigger job whose
culprits are the source's, each copy of a worker as slow as the original (an exact copy replays
alike), and blame on the tiling agrees with blame on the source figure by figure. ST (8 ranks)
tiled twice keeps the test small; the bench runs SE to 1,024 ranks."""
import os

import pytest

from partui.analysis.replay.blame import analyse
from partui.analysis.replay.bytedance_graph import bytedance_graphs
from partui.analysis.reading.op_table import read_op_table
from partui.bench.blame_scale import main, tile

REAL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "real-traces",
                    "bytedance-straggler")
pytestmark = pytest.mark.skipif(not os.path.isdir(REAL), reason="../shared/real-traces is absent "
                                "(CI has it beside the checkout)")


def test_a_tiled_job_names_the_same_culprits_and_each_copy_replays_alike(tmp_path):
    source = os.path.join(REAL, "trace-ST.parquet")
    path = tile(source, 16, str(tmp_path))
    assert os.path.basename(path) == "trace-STx2.parquet"
    meta = (tmp_path / "meta-STx2.yaml").read_text()
    assert "world_size: 16" in meta and "dp_size: 4" in meta
    df = read_op_table(path)                            # checked against its meta too
    assert df["rank"].nunique() == 16 and df["dp_rank"].nunique() == 4
    one = analyse(bytedance_graphs(read_op_table(source)))
    two = analyse(bytedance_graphs(df))
    s1 = one["summary"].set_index("figure")["value"]
    s2 = two["summary"].set_index("figure")["value"]
    for k in ("top dp rank", "top stage", "top op type", "worst worker"):
        assert s1[k] == s2[k]
    for k in ("replayed_s", "ideal_s", "slowdown", "M_S"):
        assert s2[k] == pytest.approx(s1[k], rel=1e-9)
    # rank r + 8 (the copy) is as slow as rank r, and as in the source
    w1 = dict(zip(one["by worker"]["rank"], one["by worker"]["slowdown"]))
    w2 = dict(zip(two["by worker"]["rank"], two["by worker"]["slowdown"]))
    assert set(w2) == set(w1) | {r + 8 for r in w1}
    for r, v in w1.items():
        assert w2[r] == w2[r + 8] == pytest.approx(v, rel=1e-9)


def test_ranks_not_a_multiple_of_the_source_are_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--ranks", "1000"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--ranks 1000 is not a multiple of the source's 128 ranks: pick one, e.g. 896" in err


def test_a_missing_source_is_named(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["--source", str(tmp_path / "nope.parquet")])
    assert e.value.code == 2 and "nope.parquet: no such trace" in capsys.readouterr().err
