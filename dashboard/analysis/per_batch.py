"""Wait against compute, batch by batch: for one loader, how long the training loop waited
for each batch (its GetNext) and how long it then computed before it asked for the next one.

TensorBoard's profiler overview showed this per step; here it is per batch of a loader, or
per bucket of consecutive batches where a window holds more than a figure can draw. Pure
functions of the framework frame: no I/O, no Dash.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .dataloader import getnext_segments, iterator_class, loader_name, per_category


@dataclass
class LoaderBatches:
    """One loader's batches in time order, times in epoch microseconds.

    wait_us is the GetNext; compute_us runs from its end to the start of the next GetNext of
    the same iterator (NaN for an iterator's last batch: nothing bounds its compute)."""
    start_us: np.ndarray
    end_us: np.ndarray  # the end of the batch's GetNext
    wait_us: np.ndarray
    compute_us: np.ndarray
    segment: np.ndarray  # the iterator (dataloader.iterator_segments) each batch came from

    def __len__(self) -> int:
        return len(self.start_us)


@dataclass
class BatchBuckets:
    """What a figure draws: one entry per batch, or per bucket of consecutive batches, each with
    the mean wait and compute per batch in it (compute over the batches that have one)."""
    start_us: np.ndarray  # the first batch's start
    end_us: np.ndarray  # where the last batch's compute ends (or its GetNext, when unknown)
    wait_us: np.ndarray
    compute_us: np.ndarray  # NaN: no batch in it has a known compute
    batches: np.ndarray  # batches in each
    first: np.ndarray  # the index in LoaderBatches of each one's first batch


def loader_batches(framework: pd.DataFrame, iterator: str | None = None, process: str | None = None,
                   node: str | None = None) -> LoaderBatches:
    """The batches of the GetNexts of one iterator class (as a loader names it:
    '_MultiProcessingDataLoaderIter'), on one process and node when given; None: any."""
    # Positions and per-category tests, not a copy of the GetNexts' rows and their labels as
    # strings: on a 3M-GetNext trial those took 1.5 s of the 2.1 s this took.
    rows, segment = getnext_segments(framework)
    tests = {"name": None if iterator is None else lambda name: loader_name(iterator_class(name)) == iterator,
             "process": None if process is None else lambda value: value == str(process),
             "node": None if node is None else lambda value: value == str(node)}
    keep = np.ones(len(rows), dtype=bool)
    for column, test in tests.items():
        if test is not None and column in framework:
            per_value, codes = per_category(framework[column], test, False)
            keep &= per_value.astype(bool)[codes[rows]]
    rows, segment = rows[keep], segment[keep]
    return batches_of(framework["start_us"].to_numpy(dtype="int64")[rows],
                      framework["end_us"].to_numpy(dtype="int64")[rows], segment.astype("int64"))


def batches_of(start_us: np.ndarray, end_us: np.ndarray, segment: np.ndarray) -> LoaderBatches:
    """Wait and compute of GetNext calls (start, end, iterator), in time order."""
    order = np.lexsort((start_us, segment))
    start, end, seg = start_us[order], end_us[order], segment[order]
    compute = np.full(len(start), np.nan)
    same = seg[1:] == seg[:-1]
    compute[:-1][same] = (start[1:] - end[:-1])[same]
    by_time = np.argsort(start, kind="stable")
    start, end, seg, compute = start[by_time], end[by_time], seg[by_time], compute[by_time]
    return LoaderBatches(start, end, (end - start).astype("float64"), compute, seg)


def buckets(batches: LoaderBatches, lo_us: int, hi_us: int, max_bars: int) -> BatchBuckets:
    """The batches starting in [lo_us, hi_us]: each its own bar when there are at most
    `max_bars`, else `max_bars` equal buckets of time, each the mean of its batches."""
    inside = np.flatnonzero((batches.start_us >= lo_us) & (batches.start_us <= hi_us))
    start, end = batches.start_us[inside], batches.end_us[inside]
    wait, compute = batches.wait_us[inside], batches.compute_us[inside]
    until = end + np.nan_to_num(compute, nan=0.0)
    if len(inside) <= max_bars:
        return BatchBuckets(start, until, wait, compute, np.ones(len(inside), dtype="int64"), inside)
    width = (hi_us - lo_us) / max_bars if hi_us > lo_us else 1.0
    bucket = np.clip(((start - lo_us) / width).astype("int64"), 0, max_bars - 1)
    firsts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    counts = np.diff(np.r_[firsts, len(bucket)])
    known = ~np.isnan(compute)
    compute_sum = np.add.reduceat(np.where(known, compute, 0.0), firsts)
    compute_n = np.add.reduceat(known.astype("int64"), firsts)
    with np.errstate(invalid="ignore", divide="ignore"):
        compute_mean = np.where(compute_n > 0, compute_sum / np.maximum(compute_n, 1), np.nan)
    return BatchBuckets(start[firsts], np.maximum.reduceat(until, firsts), np.add.reduceat(wait, firsts) / counts,
                        compute_mean, counts, inside[firsts])
