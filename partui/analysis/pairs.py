"""Per overlapped F&B pair (fb_overlap): each all-to-all issued inside it, how long it was in flight, how
much of that the other microbatch's parts computed under, and what stayed exposed (`partui report --by pair`).

A pair is an "FB" span on a rank's compute track (a container: it never counts as compute); its parts are the leaf spans kernels/pp/parts.py records,
named "ATTN F mb3 L1" (part, F / B / W, microbatch, layer). An all-to-all belongs to the part whose span
holds its issue time; which one it is follows from that part (kernels/pp/fb_order.py's ISSUES): forward ATTN
issues DISPATCH(F), forward MLP COMBINE(F), backward COMBINE COMBINE(B), backward MLP DISPATCH(B).

    in_flight_ms      issue to completion, as the comm layer recorded it
    under_other_ms    in flight while a part of the pair's other microbatch computed
    exposed_ms        in flight while no part of the pair computed (waits are not compute)

Of two all-to-alls one part issues, the first is uneven dispatch's blocking exchange of counts inside
ATTN: labelled "counts ... (blocking)"; the part's own span holds it, so it reads as covered. One that
landed before its part's span ended (the issue call itself took that long) says "(landed inside its part)".
"""
from __future__ import annotations

import re

import pandas as pd

from kernels.intervals import intersect, length, merge
from kernels.pp.fb_order import ISSUES

PART = re.compile(r"^(ATTN|MLP|COMBINE) ([FBW]) mb(\d+) (\S+)$")
COLUMNS = ["rank", "pair", "all_to_all", "issued_in", "in_flight_ms", "under_other_ms", "exposed_ms",
           "under"]


def _clip(spans, lo, hi):
    return [(max(b, lo), min(e, hi)) for b, e in spans if min(e, hi) > max(b, lo)]


def fb_pair_a2a(df: pd.DataFrame) -> pd.DataFrame:
    """One row per all-to-all issued inside an F&B pair (the analysis table of partui.analysis.load)."""
    rows = []
    for rank, mine in df.groupby("rank", sort=True):
        compute = mine[mine["kind"] == "compute"]
        pairs = mine[mine["cat"] == "FB"]                # a container span: structure, not compute
        parsed = compute["name"].astype(str).str.extract(PART)
        parts = compute.assign(part=parsed[0], side=parsed[1], pmb=pd.to_numeric(parsed[2]),
                               player=parsed[3]).dropna(subset=["part"])
        a2a = mine[(mine["kind"] == "comm") & (mine["op"] == "all_to_all")]
        for pair in pairs.itertuples():
            inside = parts[(parts["ts"] >= pair.ts) & (parts["end"] <= pair.end)]
            busy = merge(list(zip(inside["ts"], inside["end"])))
            ops = a2a[(a2a["ts"] >= pair.ts) & (a2a["ts"] <= pair.end)]
            for i, op in enumerate(ops.itertuples()):
                issuer = inside[(inside["ts"] <= op.ts) & (inside["end"] >= op.ts)]
                if not len(issuer):
                    continue                              # not issued by a part
                src = issuer.iloc[-1]
                which = ISSUES.get((src["side"], src["part"]))
                label = f"{which}({src['side']}) {src['player']} mb{int(src['pmb'])}" if which else "?"
                later = ops.iloc[i + 1:]
                if ((later["ts"] >= src["ts"]) & (later["ts"] <= src["end"])).any():   # its part issues another
                    label = f"counts {label} (blocking)"
                elif op.end <= src["end"]:
                    label += " (landed inside its part)"
                flight = [(op.ts, op.end)]
                other = inside[inside["pmb"] != src["pmb"]]
                under = other[(other["ts"] < op.end) & (other["end"] > op.ts)]
                rows.append({"rank": rank, "pair": pair.name, "all_to_all": label, "issued_in": src["name"],
                             "in_flight_ms": length(flight) * 1e-3,
                             "under_other_ms": intersect(merge(list(zip(under["ts"], under["end"]))), flight)
                             * 1e-3,
                             "exposed_ms": (length(flight) - intersect(busy, flight)) * 1e-3,
                             "under": ", ".join(under["name"].astype(str))})
    return pd.DataFrame(rows, columns=COLUMNS)


def pair_summary(table: pd.DataFrame) -> str:
    """One line: all-to-all time in F&B pairs, how much the other microbatch hid, and what stayed exposed."""
    if not len(table):
        return "no all-to-all inside an F&B pair (run with --fb-overlap and experts)"
    flight, other, exposed = (table[c].sum() for c in ("in_flight_ms", "under_other_ms", "exposed_ms"))
    return (f"F&B pairs: {len(table)} all-to-alls in flight {flight:.3f} ms, under the other microbatch "
            f"{other:.3f} ms ({100 * other / flight if flight else 0:.1f}%), exposed {exposed:.3f} ms "
            f"({100 * exposed / flight if flight else 0:.1f}% of in flight)")
