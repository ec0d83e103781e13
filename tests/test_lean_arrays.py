"""The assessment's arrays written in place, shifted as slices and left unwritten where they
hold no value (they set its peak memory at 3M GetNexts: bench/analyze_cli.py) give what their
plain definitions, written out here, give: on random inputs, ties and edges included."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from dashboard.analysis.diagnosis import budget, pipeline
from dashboard.trial.frames import missing_column, take_column


def inferred_service_by_definition(segment, index, worker, ask, ret, wait, delivery, workers, prefetch,
                                   first_ask, recreated):
    """The service times as positions k places back define them (np.arange, clipped gathers)."""
    n = len(wait)
    ready_known = wait > delivery + pipeline.READY_SLACK_US
    ready = np.where(ready_known, ret - delivery, np.nan)
    pos = np.arange(n)

    def same_back(k):
        return (pos - k >= 0) & (segment[np.clip(pos - k, 0, None)] == segment) & (index >= k)

    has_sender = same_back(prefetch)
    sent = np.where(has_sender, ret[np.clip(pos - prefetch, 0, None)], first_ask[segment])
    has_previous = same_back(workers)
    previous_ready = np.where(has_previous, ready[np.clip(pos - workers, 0, None)], np.nan)
    service = ready - np.fmax(sent, previous_ready)
    service[~(ready_known & has_previous & np.isfinite(previous_ready))] = np.nan
    service[~(service > 0)] = np.nan
    return service


def batches(rng, n, segments):
    """n GetNexts of `segments` iterators in a row, each numbered from 0 (one mid-epoch)."""
    sizes = rng.multinomial(n - segments, np.ones(segments) / segments) + 1
    segment = np.repeat(np.arange(segments), sizes)
    index = np.concatenate([np.arange(size) + (3 if s == 1 else 0) for s, size in enumerate(sizes)])
    wait = rng.choice([50.0, 80.0, 3000.0, 12000.0], size=n)
    ask = np.cumsum(rng.uniform(1000.0, 20000.0, size=n))
    ret = ask + wait
    first_ask = np.array([ask[segment == s][0] for s in range(segments)])
    return segment, index, ask, ret, wait, first_ask


@pytest.mark.parametrize("n, segments, workers, prefetch", [
    (400, 3, 4, 8),    # the usual: 2 batches in flight a worker
    (5, 2, 4, 8),      # fewer batches than in flight: nothing k places back
    (9, 1, 8, 16),     # one iterator, k at and beyond its length
    (300, 30, 1, 2),   # one worker, iterators of a few batches
])
def test_inferred_service_is_its_definition(n, segments, workers, prefetch):
    rng = np.random.default_rng(n + workers)
    segment, index, ask, ret, wait, first_ask = batches(rng, n, segments)
    worker = index % workers
    recreated = np.ones(segments, dtype=bool)
    service, startup = pipeline._inferred_service(segment, index, worker, ask, ret, wait, 60.0, workers, prefetch,
                                                  first_ask, recreated)
    expected = inferred_service_by_definition(segment, index, worker, ask, ret, wait, 60.0, workers, prefetch,
                                              first_ask, recreated)
    np.testing.assert_array_equal(service, expected)
    assert startup.shape == (segments, workers)
    if n > 2 * prefetch:
        assert np.isfinite(service).sum() > n // 10  # (a comparison of NaNs alone would prove nothing)


def longest_by_definition(wait, mask, limit):
    rows = np.flatnonzero(mask)
    return rows[np.argsort(-wait[rows], kind="stable")][:limit]


@pytest.mark.parametrize("seed", range(4))
def test_the_part_windows_are_the_longest_waits_in_a_stable_order(seed):
    rng = np.random.default_rng(seed)
    n = 5000
    wait = rng.choice([10, 20, 30, 40, 700, 700, 900], size=n).astype(np.int64)  # ties at the cut
    start = np.cumsum(rng.integers(1, 1000, size=n))
    calls = pd.DataFrame({"start_us": start, "end_us": start + wait, "duration_us": wait})
    first_round = rng.random(n) < 0.01
    tail = ~first_round & (rng.random(n) < 0.3)
    slow = rng.random(n) < 0.25
    few = np.zeros(n, dtype=bool)
    few[[3, 40, 41]] = True  # fewer than the limit: all of them
    windows = budget._part_windows(SimpleNamespace(calls=calls), first_round, tail, slow, few, limit=20)
    for part, mask in {"startup": first_round, "tail": tail, "throughput": ~first_round & ~tail,
                       "imbalance": slow & ~first_round, "contention": few}.items():
        rows = longest_by_definition(wait, mask, 20)
        assert windows[part] == [(int(start[r]), int(start[r] + wait[r])) for r in rows], part


def test_a_column_without_a_value_at_the_rows_taken_stays_unwritten():
    values = pd.array([7, None, None, 9, None, None], dtype="Int64")
    positions = np.array([1, 2, 4, 5, 4])
    taken = take_column(values, positions)
    pd.testing.assert_extension_array_equal(taken, values.take(positions))
    assert isinstance(taken, pd.arrays.IntegerArray) and not taken._data.any()  # zeros from calloc
    some = np.array([0, 1, 3])
    pd.testing.assert_extension_array_equal(take_column(values, some), values.take(some))
    flags = pd.array([True, None, None], dtype="boolean")
    pd.testing.assert_extension_array_equal(take_column(flags, np.array([2, 1])), missing_column(2, flags.dtype))


@pytest.mark.parametrize("index", [pd.RangeIndex(12), pd.RangeIndex(12, name="row"), pd.RangeIndex(7, 31, 2),
                                   pd.Index(np.arange(12)[::-1] * 3, name="label")])
def test_the_calls_labels_are_the_frames_at_their_rows(index):
    from dashboard.analysis.diagnosis.loaders import _labels_at

    rows = np.array([0, 4, 5, 11, 2])
    labels = _labels_at(index, rows)
    pd.testing.assert_index_equal(labels, index[rows], exact=False)
    assert labels.name == index.name
