"""The four analyses against numbers computed here from the generator's event list."""
from __future__ import annotations

import statistics

import pandas as pd
import pytest

import dashboard
from dashboard.analysis.dataloader import outlier_threshold
from dashboard.synthetic import write_trial


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("planted"))
    synthetic = write_trial(folder, hosts=2, epochs=3, train_batches=24, num_workers=2, val_batches=6,
                            slow_batches={(1, 7): 90_000, (2, 3): 40_000}, seed=3)
    return synthetic, dashboard.analyze(folder)


def test_getnext(planted):
    synthetic, result = planted
    calls = synthetic.of_kind("getnext")
    durations = [e.duration_us for e in calls]
    median = statistics.median(durations)
    assert result.getnext.count == len(calls)
    assert result.getnext.median_us == median
    assert result.getnext.max_us == max(durations)
    expected = sorted(((e.start_us, e.end_us, e.worker_id, e.node) for e in calls
                       if e.duration_us > 2 * median), reverse=False)
    got = result.getnext.outliers
    assert sorted(zip(got["start_us"], got["end_us"], got["worker_id"], got["node"].astype(str))) == expected
    # planted: epoch 1 batch 7 is served by worker 1 on each host
    assert len(expected) == 4 and {w for _, _, w, _ in expected} == {1}
    assert got["duration_us"].iloc[0] == 90_000  # longest first


def test_initialization_per_configuration(planted):
    synthetic, result = planted
    inits = synthetic.of_kind("init")
    init = result.initialization
    assert init.count == len(inits)
    rows = {(r.type, r.num_workers): r for r in init.iterators.itertuples()}
    for cls, workers in (("_MultiProcessingDataLoaderIter", 2), ("_SingleProcessDataLoaderIter", 0)):
        mine = [e.duration_us for e in inits if e.iterator_class == cls]
        row = rows[(cls, workers)]
        assert row.count == len(mine) == 6
        assert row.median_us == statistics.median(mine) and row.max_us == max(mine)
    median = statistics.median(e.duration_us for e in inits)
    expected = sorted(e.start_us for e in inits if e.duration_us > 2 * median)
    assert sorted(init.outliers["start_us"]) == expected and expected  # train inits are outliers


def test_workers(planted):
    synthetic, result = planted
    workers = synthetic.of_kind("worker")
    assert result.workers.count == len(workers) == 2 * 3 * 2  # hosts x epochs x num_workers
    assert result.workers.median_us == statistics.median(e.duration_us for e in workers)
    assert result.workers.max_us == max(e.duration_us for e in workers)


def test_batchtime_never_spans_iterators(planted):
    synthetic, result = planted
    expected = []
    by_iterator = {}
    for e in synthetic.of_kind("getnext"):
        by_iterator.setdefault((e.node, e.epoch, e.iterator_class), []).append(e)
    for calls in by_iterator.values():
        calls.sort(key=lambda e: e.start_us)
        expected += [(a.start_us, b.start_us, (b.start_us - a.start_us) / 1e6) for a, b in zip(calls, calls[1:])]
    batch = result.batchtime
    assert batch.count == len(expected) == (2 * 3 * (24 - 1 + 6 - 1))
    assert batch.median_s == pytest.approx(statistics.median(t for _, _, t in expected))
    median = statistics.median(t for _, _, t in expected)
    want = sorted((s, e) for s, e, t in expected if t > 2 * median)
    assert sorted(zip(batch.outliers["start_us"], batch.outliers["end_us"])) == want and want


def test_window_filters_by_regex(planted):
    synthetic, result = planted
    slow = max(synthetic.of_kind("getnext"), key=lambda e: e.duration_us)
    win = result.window(slow.start_us - 1000, slow.end_us + 1000, select_events=["GetNext"],
                        select_dimensions=["CPUUtilization"])
    assert set(win.framework["kind"].astype(str)) == {"getnext"}
    assert slow.start_us in set(win.framework["start_us"])
    assert set(win.system["dimension"].astype(str)) <= {"CPUUtilization"}
    with pytest.raises(ValueError, match="invalid regular expression"):
        result.window(0, 1, select_events=["("])


def test_zero_median_does_not_flag_everything():
    values = pd.Series([0] * 99 + [5_000_000])
    threshold = outlier_threshold(values)
    assert (values > threshold).sum() == 1
    assert outlier_threshold(pd.Series([0, 0, 0])) == 0  # nothing above it
    assert outlier_threshold(pd.Series([], dtype=float)) is None
    assert outlier_threshold(pd.Series([10, 10, 30])) == 20


def test_outlier_factor_is_a_parameter(tmp_path):
    synthetic = write_trial(str(tmp_path), slow_batches={(0, 3): 3_000}, getnext_us=(1000, 1000))
    assert len(dashboard.analyze(str(tmp_path)).getnext.outliers) == 1
    assert len(dashboard.analyze(str(tmp_path), outlier_factor=4).getnext.outliers) == 0


def test_node_filter(planted, tmp_path):
    synthetic, result = planted
    one = dashboard.analyze(result.trial, node="algo-2")
    assert one.getnext.count == len([e for e in synthetic.of_kind("getnext") if e.node.endswith("algo-2")])
    assert set(one.trial.system["node"].astype(str)) == {"algo-2"}
