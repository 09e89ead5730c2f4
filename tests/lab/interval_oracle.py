"""Plain-Python interval arithmetic: the independent oracle the analysis tests hold the vectorized
sweeps to (sorted lists, no numpy, no partui code)."""


def merged(intervals):
    """The intervals' union as sorted, disjoint [start, end] pairs (empty ones dropped)."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        elif b > a:
            out.append([a, b])
    return out


def length(xs):
    return sum(b - a for a, b in xs)


def covered(xs, ys):
    """Length of merged xs inside merged ys."""
    return sum(max(0, min(b, d) - max(a, c)) for a, b in xs for c, d in ys)
