"""Per overlapped F&B pair (fb_overlap): each all-to-all issued inside it, how long it was in flight, how
much of that the other microbatch's parts computed under, and what stayed exposed (`partui report --by pair`).

A pair is an "FB" span on a rank's compute track (a container: it never counts as compute); its parts are
the leaf spans kernels/pp/parts.py records, named "ATTN F mb3 L1" (part, F / B / W, microbatch, layer).
Without --fb-overlap the same figures are read for comparison: DualPipe's pairs run one side after the
other, and 1F1B's pair is a forward action directly followed by a backward one; the layer spans ("F block 2",
"B head") stand for the parts there. An all-to-all belongs to the part whose span
holds its issue time; which one it is follows from that part (planning/pipeline/fb_order.py's ISSUES): forward ATTN
issues DISPATCH(F), forward MLP COMBINE(F), backward COMBINE COMBINE(B), backward MLP DISPATCH(B).

    in_flight_ms      issue to completion, as the comm layer recorded it
    under_other_ms    in flight while a part of the pair's other microbatch computed (less its waits)
    exposed_ms        in flight while no part of the pair computed: a wait, or posting an op, inside a
                      part is not compute

Of two all-to-alls one part issues, the first is uneven dispatch's blocking exchange of counts inside
ATTN: labelled "counts ... (blocking)"; its wait is exposed though its part's span holds it. One that
landed before its part's span ended (the issue call itself took that long) says "(landed inside its part)".
"""
from __future__ import annotations

import re

import pandas as pd

from planning.intervals import intersect, length, merge, subtract
from planning.pipeline.fb_order import ISSUES

PART = re.compile(r"^(ATTN|MLP|COMBINE) ([FBW]) mb(\d+) (\S+)$")
COLUMNS = ["rank", "pair", "all_to_all", "issued_in", "in_flight_ms", "under_other_ms", "exposed_ms",
           "under"]


def _windows(mine: pd.DataFrame) -> list[tuple[str, float, float]]:
    """(name, ts, end) of each F&B pair on one rank: its FB spans; on a rank with none (1F1B without
    --fb-overlap), each forward action directly followed by a backward one, the pair fb_overlap would make."""
    pairs = mine[mine["cat"] == "FB"]
    if len(pairs):
        return list(zip(pairs["name"].astype(str), pairs["ts"], pairs["end"]))
    acts = mine[mine["cat"].isin(["F", "B"]) & mine["kind"].isin(["compute", "container"])]
    if "chunk" in acts:
        acts = acts[acts["chunk"].notna()]
    acts = acts.sort_values("ts")
    rows = list(zip(acts["cat"], acts["name"].astype(str), acts["ts"], acts["end"]))
    return [(f"{n1} then {n2}", t1, e2) for (c1, n1, t1, _), (c2, n2, _, e2) in zip(rows, rows[1:])
            if c1 == "F" and c2 == "B"]


def fb_pair_a2a(df: pd.DataFrame) -> pd.DataFrame:
    """One row per all-to-all issued inside an F&B pair (the analysis table of partui.analysis.load).
    With --fb-overlap the pair's parts name each one; without it (DualPipe's pairs one side after the
    other, 1F1B's forward then backward) the layer span it was issued in does, "(F) in F block 2"."""
    rows = []
    for rank, mine in df.groupby("rank", sort=True):
        compute = mine[mine["kind"] == "compute"]
        parsed = compute["name"].astype(str).str.extract(PART)
        parts = compute.assign(part=parsed[0], side=parsed[1], mbside=parsed[1].replace("W", "B"),
                               pmb=parsed[2], player=parsed[3]).dropna(subset=["part"])
        layers = compute[(compute["cat"] == "layer") & compute["name"].astype(str).str.match(r"^[FB] ")]
        layers = layers.assign(side=layers["name"].astype(str).str[0], part=None)
        layers["mbside"] = layers["side"]                  # which microbatch: the forward's or the backward's
        waits = merge(list(zip(*(mine.loc[mine["kind"] == "wait", c] for c in ("ts", "end")))))
        a2a = mine[(mine["kind"] == "comm") & (mine["op"] == "all_to_all")]
        for name, t0, t1 in _windows(mine):
            inside = parts[(parts["ts"] >= t0) & (parts["end"] <= t1)]
            if not len(inside):                           # one side after the other: its layer spans
                inside = layers[(layers["ts"] >= t0) & (layers["end"] <= t1)]
            busy = subtract(merge(list(zip(inside["ts"], inside["end"]))), waits)   # waits are not compute
            ops = a2a[(a2a["ts"] >= t0) & (a2a["ts"] <= t1)]
            for i, op in enumerate(ops.itertuples()):
                issuer = inside[(inside["ts"] <= op.ts) & (inside["end"] >= op.ts)]
                if not len(issuer):
                    continue                              # not issued by a part or a layer
                src = issuer.iloc[-1]
                if src["part"] is None:
                    label = f"({src['side']}) in {src['name']}"
                else:
                    which = ISSUES.get((src["side"], src["part"]))
                    label = f"{which}({src['side']}) {src['player']} mb{src['pmb']}" if which else "?"
                later = ops.iloc[i + 1:]
                if ((later["ts"] >= src["ts"]) & (later["ts"] <= src["end"])).any():   # it issues another
                    label = f"counts {label} (blocking)"
                elif op.end <= src["end"]:
                    label += " (landed inside its part)"
                flight = [(op.ts, op.end)]
                other = inside[inside["mbside"] != src["mbside"]]
                under = other[(other["ts"] < op.end) & (other["end"] > op.ts)]
                rows.append({"rank": rank, "pair": name, "all_to_all": label, "issued_in": src["name"],
                             "in_flight_ms": length(flight) * 1e-3,
                             "under_other_ms": intersect(subtract(merge(list(zip(under["ts"], under["end"]))),
                                                                  waits), flight) * 1e-3,
                             "exposed_ms": (length(flight) - intersect(busy, flight)) * 1e-3,
                             "under": ", ".join(under["name"].astype(str))})
    return pd.DataFrame(rows, columns=COLUMNS)


def pair_summary(table: pd.DataFrame) -> str:
    """One line: all-to-all time in F&B pairs, how much the other microbatch hid, and what stayed exposed."""
    if not len(table):
        return ("no all-to-all inside an F&B pair (a pipeline with experts: an FB span, or a forward then a "
                "backward; run with --pp, --experts and --fb-overlap)")
    flight, other, exposed = (table[c].sum() for c in ("in_flight_ms", "under_other_ms", "exposed_ms"))
    own = max(0.0, flight - other - exposed)   # the rest: busy, but with its own microbatch's compute
    return (f"F&B pairs: {len(table)} all-to-alls in flight {flight:.3f} ms = under the other microbatch "
            f"{other:.3f} ms ({_pct(other, flight)}) + under their own microbatch's compute {own:.3f} ms "
            f"({_pct(own, flight)}) + exposed {exposed:.3f} ms ({_pct(exposed, flight)})")


def _pct(part: float, whole: float) -> str:
    """A share as printed: '-' where there is no whole to share (no all-to-all: nothing was hidden or not)."""
    return f"{100 * part / whole:.1f}%" if whole else "-"
