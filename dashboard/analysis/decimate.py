"""Reducing long series to what a screen can show: pure functions over arrays.

A figure never needs more than a few points per horizontal pixel. These helpers pick,
per pixel bucket, the points that keep the picture the same (the minimum and the
maximum of each bucket, in time order), keep every point over a threshold (a stall is
never lost to a neighbour that happens to share its pixel), merge intervals that would
overlap on screen, and count values into log-spaced bins. They return indices or small arrays, so a caller
can carry any other column (hover text, ids) along.
"""
from __future__ import annotations

import numpy as np

# About one bucket per horizontal pixel of a wide figure.
DEFAULT_BUCKETS = 1200


def minmax_indices(x: np.ndarray, y: np.ndarray, buckets: int = DEFAULT_BUCKETS,
                   lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """Indices of the points to draw: the min and max y of each of `buckets` equal x-buckets.

    Keeps every point when there are at most two per bucket. Points with NaN y are dropped.
    The result is sorted by x (then by original position), so a line through it draws the
    same envelope as the full series.
    """
    x = np.asarray(x)
    y = np.asarray(y, dtype="float64")
    valid = ~np.isnan(y)
    index = np.flatnonzero(valid) if not valid.all() else np.arange(len(x))
    if len(index) == 0:
        return index
    xs, ys = x[index], y[index]
    if len(xs) > 1 and np.any(xs[1:] < xs[:-1]):
        order = np.argsort(xs, kind="stable")
        index, xs, ys = index[order], xs[order], ys[order]
    buckets = max(1, int(buckets))
    if len(xs) <= 2 * buckets:
        return index
    lo = float(xs[0]) if lo is None else float(lo)
    hi = float(xs[-1]) if hi is None else float(hi)
    width = (hi - lo) / buckets if hi > lo else 1.0
    bucket = np.clip(((xs - lo) / width).astype("int64"), 0, buckets - 1)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    counts = np.diff(np.r_[starts, len(xs)])
    segment = np.repeat(np.arange(len(starts)), counts)
    keep = [_first_where(ys == np.minimum.reduceat(ys, starts)[segment], segment),
            _first_where(ys == np.maximum.reduceat(ys, starts)[segment], segment)]
    return index[np.unique(np.concatenate(keep))]


# Points over a threshold kept one by one up to this many; past it, the largest of each bucket.
MAX_PEAKS = 5_000


def peaks_over(x: np.ndarray, y: np.ndarray, threshold: float, buckets: int = DEFAULT_BUCKETS,
               lo: float | None = None, hi: float | None = None, limit: int = MAX_PEAKS) -> np.ndarray:
    """Indices of the points whose y is over `threshold`, in x order: every one of them when
    there are at most `limit`; else the largest of each of `buckets` equal x-buckets that
    holds any, so that no stretch of time with a stall is drawn without one.

    For the marks of GetNext stalls, drawn over a series that minmax_indices reduced (which
    keeps one maximum per bucket: two stalls in a bucket would lose one).
    """
    x = np.asarray(x)
    y = np.asarray(y, dtype="float64")
    over = np.flatnonzero(y > threshold)
    if len(over) > 1 and np.any(x[over][1:] < x[over][:-1]):
        over = over[np.argsort(x[over], kind="stable")]
    if len(over) <= limit:
        return over
    xs = x[over].astype("float64")
    lo = float(xs[0]) if lo is None else float(lo)
    hi = float(xs[-1]) if hi is None else float(hi)
    buckets = max(1, int(buckets))
    width = (hi - lo) / buckets if hi > lo else 1.0
    bucket = np.clip(((xs - lo) / width).astype("int64"), 0, buckets - 1)
    # Largest first within each bucket, then the first of each bucket.
    order = np.lexsort((-y[over], bucket))
    first = order[np.r_[True, bucket[order][1:] != bucket[order][:-1]]]
    return over[np.sort(first)]


def _first_where(hit: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Position of the first True of each segment (every segment has one)."""
    where = np.flatnonzero(hit)
    seg = segment[where]
    return where[np.r_[True, seg[1:] != seg[:-1]]]


def merge_intervals(start: np.ndarray, end: np.ndarray, group: np.ndarray, gap: float):
    """Merge intervals of the same group that lie within `gap` of each other.

    For Gantt bars: two events closer than a pixel draw as one bar anyway. Returns
    (start, end, group, count, first) arrays, one entry per merged bar, sorted by group
    then start; `count` is how many events a bar stands for and `first` the input
    position of its first event.
    """
    start = np.asarray(start, dtype="int64")
    end = np.maximum(np.asarray(end, dtype="int64"), start)
    group = np.asarray(group, dtype="int64")
    if len(start) == 0:
        empty = np.array([], dtype="int64")
        return empty, empty, empty, empty, empty
    order = np.lexsort((start, group))
    s, e, g = start[order], end[order], group[order]
    # Shift each group's times so that groups are disjoint and increasing; one running
    # maximum of the ends then never carries across a group boundary.
    boundaries = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    counts = np.diff(np.r_[boundaries, len(s)])
    group_lo = np.minimum.reduceat(s, boundaries)
    group_hi = np.maximum.reduceat(e, boundaries)
    spans = group_hi - group_lo + int(gap) + 2
    offsets = np.repeat(np.r_[0, np.cumsum(spans)[:-1]] - group_lo, counts)
    s2, e2 = s + offsets, e + offsets
    reach = np.maximum.accumulate(e2)
    new = np.r_[True, s2[1:] > reach[:-1] + gap]
    first = np.flatnonzero(new)
    merged_end = np.maximum.reduceat(e, first)
    sizes = np.diff(np.r_[first, len(s)])
    return s[first], merged_end, g[first], sizes, order[first]


def log_histogram(values: np.ndarray, bins: int = 60, floor: float = 1.0):
    """Counts of `values` in log-spaced bins: (edges, counts). Values below `floor` count in the first."""
    values = np.asarray(values, dtype="float64")
    values = values[~np.isnan(values)]
    if len(values) == 0:
        return np.array([floor, floor * 10]), np.array([0])
    values = np.maximum(values, floor)
    lo, hi = np.log10(values.min()), np.log10(values.max())
    if hi - lo < 1e-9:
        lo, hi = lo - 0.05, hi + 0.05
    edges = np.logspace(lo, hi, bins + 1)
    # 10 ** log10(v) may miss v by a rounding error: pin the ends so no value falls outside.
    edges[0], edges[-1] = min(edges[0], values.min()), max(edges[-1], values.max())
    counts, edges = np.histogram(values, bins=edges)
    return edges, counts
