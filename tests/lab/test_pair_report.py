"""`partui report --by pair`: each all-to-all inside an F&B pair, on a hand-built table with known answers."""
import pandas as pd
import pytest

from partui.analysis.figures.pairs import fb_pair_a2a, pair_summary


def _table(rows):
    return pd.DataFrame(rows, columns=["rank", "kind", "cat", "name", "ts", "end", "op"])


def test_pair_a2a_by_hand():
    """Times in µs. Parts ATTN F mb3 [0,10], COMBINE B mb1 [12,14], MLP F mb3 [20,40], MLP B mb1 [40,50],
    MLP W mb1 [60,70]. DISPATCH(F) [9,30]: the other microbatch computes [12,14] = 2; computing at all
    [9,10] + [12,14] + [20,30] = 13, so 8 exposed. COMBINE(B) [13,25]: other [20,25] = 5; exposed 12 - 1 - 5
    = 6. DISPATCH(B) [45,65]: no mb3 part under it; covered [45,50] + [60,65], exposed 10. A count exchange
    [2,5] inside ATTN F (which issues DISPATCH(F) after it) is blocking and covered by its own part."""
    rows = [(0, "compute", "FB", "FB mb3 c0 / mb1 c0", 0, 100, None),
            (0, "compute", "F", "ATTN F mb3 L1", 0, 10, None),
            (0, "compute", "B", "COMBINE B mb1 L2", 12, 14, None),
            (0, "compute", "F", "MLP F mb3 L1", 20, 40, None),
            (0, "compute", "B", "MLP B mb1 L2", 40, 50, None),
            (0, "compute", "W", "MLP W mb1 L2", 60, 70, None),
            (0, "compute", "expert", "experts", 21, 39, None),           # an inner span: not a part
            (0, "comm", "comm", "all_to_all", 2, 5, "all_to_all"),
            (0, "comm", "comm", "all_to_all", 9, 30, "all_to_all"),
            (0, "comm", "comm", "all_to_all", 13, 25, "all_to_all"),
            (0, "comm", "comm", "all_to_all", 45, 65, "all_to_all"),
            (0, "comm", "comm", "send", 41, 90, "send"),                    # pipeline p2p: not listed
            (0, "comm", "comm", "all_to_all", 120, 130, "all_to_all")]      # outside the pair
    t = fb_pair_a2a(_table(rows))
    assert list(t["all_to_all"]) == ["counts DISPATCH(F) L1 mb3 (blocking)", "DISPATCH(F) L1 mb3",
                                     "COMBINE(B) L2 mb1", "DISPATCH(B) L2 mb1"]
    assert list(t["in_flight_ms"] * 1e3) == pytest.approx([3, 21, 12, 20])
    assert list(t["under_other_ms"] * 1e3) == pytest.approx([0, 2, 5, 0])
    assert list(t["exposed_ms"] * 1e3) == pytest.approx([0, 8, 6, 10])
    assert list(t["under"]) == ["", "COMBINE B mb1 L2", "MLP F mb3 L1", ""]
    # the three shares add up: 7 + 25 + 24 = 56 us (the 25: in flight under its own side's compute)
    assert pair_summary(t) == ("F&B pairs: 4 all-to-alls in flight 0.056 ms = under the other microbatch "
                               "0.007 ms (12.5%) + under their own microbatch's compute 0.025 ms (44.6%) "
                               "+ exposed 0.024 ms (42.9%)")


def test_no_pairs_says_how_to_get_them():
    t = fb_pair_a2a(_table([(0, "compute", "F", "F mb0 c0", 0, 10, None)]))
    assert t.empty and "--fb-overlap" in pair_summary(t)


def test_pairs_without_fb_overlap_and_waits_inside_parts_by_hand():
    """1F1B without --fb-overlap: F mb1 [0,30] directly followed by BW mb0 [30,60] is one pair; their layer
    spans stand for the parts. An all-to-all [5,20] issued in F block 0, which waits on it [10,20]: computing
    only [5,10], so 10 of 15 exposed, nothing of the other microbatch under it; it landed before its layer
    span ended (one side after the other waits inside it). One [40,70] issued in B block
    0 [30,60]: covered [40,60], exposed 10. The lone F mb2 [100,110] after them pairs with no backward."""
    rows = [(0, "compute", "F", "F mb1 c0", 0, 30, None, 0.0),
            (0, "compute", "layer", "F block 0", 0, 30, None, None),
            (0, "wait", "wait", "wait all_to_all", 10, 20, "all_to_all", None),
            (0, "compute", "B", "BW mb0 c0", 30, 60, None, 0.0),
            (0, "compute", "layer", "B block 0", 30, 60, None, None),
            (0, "compute", "F", "F mb2 c0", 100, 110, None, 0.0),
            (0, "compute", "layer", "F block 0", 100, 110, None, None),
            (0, "comm", "comm", "all_to_all", 5, 20, "all_to_all", None),
            (0, "comm", "comm", "all_to_all", 40, 70, "all_to_all", None),
            (0, "comm", "comm", "all_to_all", 101, 109, "all_to_all", None)]     # no pair: not listed
    t = fb_pair_a2a(pd.DataFrame(rows, columns=["rank", "kind", "cat", "name", "ts", "end", "op", "chunk"]))
    assert list(t["pair"]) == ["F mb1 c0 then BW mb0 c0"] * 2
    assert list(t["all_to_all"]) == ["(F) in F block 0 (landed inside its part)", "(B) in B block 0"]
    assert list(t["in_flight_ms"] * 1e3) == pytest.approx([15, 30])
    assert list(t["exposed_ms"] * 1e3) == pytest.approx([10, 10])
    assert list(t["under_other_ms"] * 1e3) == pytest.approx([0, 0])
