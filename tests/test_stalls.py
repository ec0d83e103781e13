"""GetNext stalls stay visible at any zoom: no reduction of a figure drops one.

A stall is a GetNext over the outlier threshold (2 x the median), counted here from the events
the synthetic writer reports."""
from __future__ import annotations

import statistics

import numpy as np
import pytest

import dashboard
from dashboard import synthetic
from dashboard.analysis import decimate


def _decoded(values):
    import base64

    if isinstance(values, dict):
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])
    return np.asarray(values, dtype="float64")


def test_peaks_over_keeps_every_point_over_the_threshold_or_the_largest_of_each_bucket():
    rng = np.random.default_rng(5)
    x = np.sort(rng.uniform(0, 1_000, 50_000))
    y = rng.uniform(0, 1, len(x))
    y[[10, 11, 20_000, 49_999]] = [5, 6, 7, 8]  # two of them in one bucket of any size
    assert decimate.peaks_over(x, y, 1.0).tolist() == [10, 11, 20_000, 49_999]
    # Past the limit: the largest of each bucket that has any, in x order.
    over = np.flatnonzero(y > 0.5)
    kept = decimate.peaks_over(x, y, 0.5, buckets=100, lo=0, hi=1_000, limit=50)
    bucket = np.minimum((x / 10).astype(int), 99)
    assert kept.tolist() == sorted(kept.tolist())
    assert len(kept) == len(np.unique(bucket[over]))
    for b in np.unique(bucket[over]):
        mine = over[bucket[over] == b]
        assert y[kept[bucket[kept] == b]].tolist() == [y[mine].max()]


@pytest.fixture(scope="module")
def job_300k(tmp_path_factory):
    """300,000 GetNexts with stalls planted: two in consecutive batches (one pixel of any
    overview), some alone, at the start and the end of epochs."""
    folder = str(tmp_path_factory.mktemp("stalls") / "trial")
    slow = {(epoch, batch): 20_000 + 1_000 * epoch + batch % 997
            for epoch in range(10) for batch in (0, 5, 6, 15_000, 29_999)}
    written = synthetic.write_trial(folder, epochs=10, train_batches=30_000, num_workers=4, val_batches=0,
                                    getnext_us=(300, 700), step_us=(500, 900), system_interval_s=1.0,
                                    slow_batches=slow)
    return written, dashboard.load_trial(folder)


def test_every_stall_over_the_threshold_survives_decimation_in_a_300k_trial(job_300k):
    from dashboard.web import views

    written, trial = job_300k
    calls = written.of_kind("getnext")
    assert len(calls) == 300_000
    threshold = 2 * statistics.median(e.duration_us for e in calls)
    stalls = sorted((e for e in calls if e.duration_us > threshold), key=lambda e: e.start_us)
    assert len(stalls) == 50  # those planted, and no other
    view = views.trial_view(trial)
    payload = views.window_payload(view, *view.span)
    # The overview (always the whole job): a mark at each stall's start.
    [marks] = [t for t in payload["overview_figure"]["data"] if t.get("meta") == "stall-marks"]
    assert sorted(np.round(_decoded(marks["x"]) * 1000).astype(int).tolist()) == [e.start_us for e in stalls]
    # The detail view of the whole job: a tick on each stall, and each covered by a stall bar
    # (of the stall colour, never merged into the ordinary GetNexts' bar).
    window = payload["window_figure"]
    [ticks] = [t for t in window["data"] if t.get("meta") == "stall-marks"]
    middles = sorted(np.round(_decoded(ticks["x"]) * 1000).astype(int).tolist())
    assert middles == [round((e.start_us + e.end_us) / 2) for e in stalls]
    [bars] = [t for t in window["data"] if t.get("meta") == "stall-bars"]
    x = _decoded(bars["x"])
    x = x[~np.isnan(x)].reshape(-1, 3) * 1000
    for stall in stalls:
        assert np.any((x[:, 0] <= stall.start_us + 1) & (x[:, 2] >= stall.end_us - 1)), stall
    # The ordinary GetNext bars hold no stall: theirs is its own colour.
    ordinary = next(t for t in window["data"] if t["name"] == "DataLoaderIter")
    assert ordinary["line"]["color"] != bars["line"]["color"]
