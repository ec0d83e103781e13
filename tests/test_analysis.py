"""The four analyses against numbers computed here from the generator's event list."""
from __future__ import annotations

import statistics

import numpy as np
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
    # An outlier names its host (the node), its process's pid and its rank (none: not distributed).
    expected = sorted(((e.start_us, e.end_us, e.worker_id, e.node.split("-", 1)[1], e.pid) for e in calls
                       if e.duration_us > 2 * median), reverse=False)
    got = result.getnext.outliers
    assert sorted(zip(got["start_us"], got["end_us"], got["worker_id"], got["node"].astype(str), got["pid"])) == expected
    assert got["rank"].isna().all()
    # planted: epoch 1 batch 7 is served by worker 1 on each host
    assert len(expected) == 4 and {w for _, _, w, _, _ in expected} == {1}
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
    write_trial(str(tmp_path), slow_batches={(0, 3): 3_000}, getnext_us=(1000, 1000))
    assert len(dashboard.analyze(str(tmp_path)).getnext.outliers) == 1
    assert len(dashboard.analyze(str(tmp_path), outlier_factor=4).getnext.outliers) == 0


def test_node_filter(planted, tmp_path):
    synthetic, result = planted
    one = dashboard.analyze(result.trial, node="algo-2")
    assert one.getnext.count == len([e for e in synthetic.of_kind("getnext") if e.node.endswith("algo-2")])
    assert set(one.trial.system["node"].astype(str)) == {"algo-2"}


def _random_framework(seed: int, one_process: bool = False, recorded: bool = False) -> pd.DataFrame:
    """GetNexts and initializations of two iterator classes on several processes of two
    nodes, with ties in time, missing pids and explicit iterator ids: the cases that decide
    where an iterator ends. one_process: one process, pid and iterator class at distinct times
    (a single-GPU job's loader), whose calls and initializations are in the sorts' order
    already (dataloader.lexsort_or_none leaves them). recorded: initializations carry iterator
    ids too (this project's collector's), so that calls of those iterators interleave with
    other calls; some calls name an id no initialization has (an iterator made before the
    recording began), some none."""
    import random

    rng = random.Random(seed)
    classes = ["_MultiProcessingDataLoaderIter"] if one_process else ["_MultiProcessingDataLoaderIter",
                                                                      "_SingleProcessDataLoaderIter"]
    rows = []
    for index in range(rng.randint(50, 400)):
        cls = rng.choice(classes)
        kind = rng.choice(["getnext"] * 6 + ["init", "other"])
        name = {"getnext": f"{cls}::GetNext", "init": f"{cls}.__init__", "other": "Step:ModeKeys.TRAIN"}[kind]
        # coarse: many equal start times (one process: none)
        start = index * 1000 + rng.randint(0, 999) if one_process else rng.randint(0, 60) * 1000
        process = "1-algo-1" if one_process else rng.choice(["2-algo-2", "1-algo-1"])
        rows.append({"process": process, "node": process.split("-", 1)[1],
                     "pid": 11 if one_process else rng.choice([11, 12, None]),
                     "name": name, "kind": kind, "start_us": start, "end_us": start + rng.randint(0, 900),
                     "worker_id": rng.choice([0, 1, None]),
                     "iterator_id": (rng.choice([None, 1, 2, 3, 4]) if recorded else rng.choice([None, None, 1, 2]))
                     if kind == "getnext" else rng.choice([1, 2, 3]) if recorded else None,
                     "rank": None})
    frame = pd.DataFrame(rows).sort_values("start_us", kind="stable").reset_index(drop=True)
    return frame.astype({"process": "category", "node": "category", "name": "category", "kind": "category", "pid": "Int64",
                         "worker_id": "Int64", "iterator_id": "Int64", "rank": "Int64"})


def _expected_batches(frame: pd.DataFrame) -> list[tuple]:
    """The batch rule written out plainly. A call with an iterator id, on a process and pid
    with initializations that carry ids: its batch runs to the next call of that id and class
    on that process and pid, whatever calls come between. The other calls, of one process in
    time order among themselves: a batch runs to the next such call unless process, pid, class,
    the count of that class's initializations without an id on that process so far, or the
    iterator id changes between them."""
    records = frame.to_dict("records")
    for position, row in enumerate(records):
        row["position"] = position
        row["cls"] = str(row["name"]).split("::")[0].split(".__init__")[0]
        row["pid"] = -1 if pd.isna(row["pid"]) else int(row["pid"])
        row["iterator_id"] = -1 if pd.isna(row["iterator_id"]) else int(row["iterator_id"])
    inits = [r for r in records if r["kind"] == "init"]
    calls = sorted((r for r in records if r["kind"] == "getnext"),
                   key=lambda r: (r["process"], r["pid"], r["start_us"], r["position"]))

    naming = {(i["process"], i["pid"]) for i in inits if i["iterator_id"] >= 0}

    def recorded(call):
        return call["iterator_id"] >= 0 and (call["process"], call["pid"]) in naming

    def key(call):
        if recorded(call):
            return "recorded", call["process"], call["pid"], call["iterator_id"], call["cls"]
        seen = sum(1 for i in inits if (i["process"], i["pid"], i["cls"]) == (call["process"], call["pid"], call["cls"])
                   and i["start_us"] <= call["start_us"] and i["iterator_id"] < 0)
        return call["process"], call["pid"], call["cls"], seen, call["iterator_id"]

    runs: dict = {}  # the calls of each recorded iterator; the other calls of each process and pid
    for call in calls:
        runs.setdefault(key(call) if recorded(call) else (call["process"], call["pid"]), []).append(call)
    return sorted((this["start_us"], following["start_us"], this["node"], this["pid"])  # node: the host
                  for run in runs.values() for this, following in zip(run, run[1:]) if key(this) == key(following))


@pytest.mark.parametrize("recorded", [False, True])
@pytest.mark.parametrize("one_process", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_batchtime_matches_the_rule_written_out(seed, one_process, recorded, monkeypatch):
    from dashboard.analysis import dataloader
    from dashboard.analysis.dataloader import analyze_batchtime, iterator_segments

    frame = _random_framework(seed, one_process, recorded)
    sorts = []  # (the sorts call_segments and batch_times made: None where rows were in order)
    lexsort_or_none = dataloader.lexsort_or_none

    def noted(*keys):
        sorts.append(lexsort_or_none(*keys))
        return sorts[-1]

    monkeypatch.setattr(dataloader, "lexsort_or_none", noted)
    result = analyze_batchtime(frame)
    got = sorted(zip(result.batches["start_us"], result.batches["end_us"], result.batches["node"].astype(str),
                     result.batches["pid"].fillna(-1).astype(int)))
    assert got == _expected_batches(frame)
    assert result.count == len(got)
    assert list(result.batches["start_us"]) == sorted(result.batches["start_us"])
    assert (result.batches["batch_time_s"] == (result.batches["end_us"] - result.batches["start_us"]) / 1e6).all()
    segments = iterator_segments(frame)
    assert list(segments.index) == list(frame.index[frame["kind"] == "getnext"])
    # One process: every sort skipped (the path this case is for), unless calls of recorded
    # iterators interleave with others (then they are put together); several: sorts made.
    if not one_process:
        assert any(order is not None for order in sorts)
    elif not recorded:
        assert all(order is None for order in sorts)


def test_batchtime_of_a_trial_without_getnext():
    frame = _random_framework(0)
    frame = frame[frame["kind"] != "getnext"].reset_index(drop=True)
    from dashboard.analysis.dataloader import analyze_batchtime, iterator_segments

    result = analyze_batchtime(frame)
    assert result.count == 0 and result.median_s is None and result.outliers.empty
    assert iterator_segments(frame).empty


@pytest.mark.parametrize("trial", ["sample", "job"])
def test_an_assessment_computed_first_is_the_one_computed_when_asked(trial, tmp_path):
    """`analyze(assess=True)` (the command line's order: it lowers the peak memory) gives the
    same answers as the assessment computed when first asked for, on the bundled sample (a
    collector trial with fetch events) and on a job of 8 ranks with a slow one."""
    import json
    import os

    from dashboard.report import to_dict
    from dashboard.synthetic import write_job
    from tests.conftest import ROOT

    if trial == "sample":
        folder = os.path.join(ROOT, "examples", "sample-trial", "trial")
    else:
        folder = str(tmp_path)
        write_job(folder, hosts=2, ranks_per_host=4, slow_rank=5, seed=2)
    loaded = dashboard.load_trial(folder)
    first = dashboard.analyze(loaded, assess=True)
    later = dashboard.analyze(loaded)
    assert "assessment" in first.__dict__ and "assessment" not in later.__dict__
    first_dict, later_dict = to_dict(first), to_dict(later)
    assert first_dict["budget"] and first_dict["verdict"]["input_percent"] is not None
    assert json.dumps(first_dict, sort_keys=True) == json.dumps(later_dict, sort_keys=True)
    # The what-if the assessment answers later too, from its own models.
    assert first.what_if({"num_workers": 8}) == later.what_if({"num_workers": 8})


@pytest.mark.parametrize("seed", range(20))
def test_lexsort_or_none_is_lexsort_and_none_exactly_where_lexsort_moves_nothing(seed):
    from dashboard.analysis.dataloader import lexsort_or_none

    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 60))  # (shuffled rows this many are never in order by chance)
    keys = [rng.integers(0, 3, size=n) for _ in range(3)]  # few values: many ties
    if seed % 2:  # in order already, ties included: a stable sort moves nothing
        keys = [key[np.lexsort(keys)] for key in keys]
    expected = np.lexsort(keys)
    got = lexsort_or_none(*keys)
    if got is None:
        assert np.array_equal(expected, np.arange(n))
    else:
        assert np.array_equal(got, expected) and not np.array_equal(expected, np.arange(n))
    assert (got is None) == bool(seed % 2)
    empty = np.zeros(0, dtype=np.int64)
    assert lexsort_or_none(empty, empty) is None


@pytest.mark.parametrize("case", ["planted", "sample", "zero_median", "no_getnext"])
def test_the_panels_without_their_events_have_the_same_numbers_and_outliers(case, planted, tmp_path):
    """events=False (`app.py analyze`, which prints no figure): every count, median, maximum and
    outlier as with the events, and the events' frames empty with their columns and types."""
    import os

    from dashboard.analysis import dataloader
    from dashboard.report import to_dict
    from tests.conftest import ROOT

    if case in ("planted", "sample"):
        trial = planted[1].trial if case == "planted" else dashboard.load_trial(
            os.path.join(ROOT, "examples", "sample-trial", "trial"))
        frame = trial.framework
        whole, light = dashboard.analyze(trial), dashboard.analyze(trial, events=False)
        assert to_dict(whole) == to_dict(light)
    elif case == "zero_median":  # GetNexts that took no time (a coarse timer): Tukey's far-out outliers
        write_trial(str(tmp_path), getnext_us=(0, 0), slow_batches={(0, 3): 7_000, (1, 9): 9_000})
        frame = dashboard.load_trial(str(tmp_path)).framework
    else:
        frame = planted[1].trial.framework
        frame = frame[(frame["kind"] != "getnext").to_numpy()]
    whole, light = dataloader.analyze(frame), dataloader.analyze(frame, events=False)
    for name in ("initialization", "workers", "getnext", "batchtime"):
        full, bare = getattr(whole, name), getattr(light, name)
        assert (full.count, getattr(full, "median_us", None), getattr(full, "max_us", None)) == (
            bare.count, getattr(bare, "median_us", None), getattr(bare, "max_us", None)), name
        pd.testing.assert_frame_equal(full.outliers, bare.outliers, check_exact=True)
        events = "batches" if name == "batchtime" else "events"
        kept = getattr(light, name).__dict__[events]
        expected = getattr(whole, name).__dict__[events]
        if name == "initialization":  # (a few rows: always kept)
            pd.testing.assert_frame_equal(kept, expected)
        else:
            assert kept.empty and list(kept.columns) == list(expected.columns), name
            assert list(kept.dtypes) == list(expected.dtypes), name
    if case == "zero_median":
        assert whole.getnext.median_us == 0 and sorted(whole.getnext.outliers["duration_us"]) == [7_000, 9_000]
    if case == "no_getnext":
        assert whole.getnext.count == 0 and whole.getnext.outliers.empty and whole.batchtime.count == 0
    else:
        assert len(whole.getnext.outliers) and len(whole.batchtime.outliers), case


@pytest.mark.parametrize("factor", [0, -1, 1, float("nan"), float("inf"), "3", True, None])
def test_the_api_refuses_an_outlier_factor_the_command_line_refuses(factor):
    # The command line checked it; the API took NaN, 0 or -1 silently (no outlier, or every value
    # one), and a string failed deep inside with a TypeError.
    from dashboard.by_rank import analyze_by_rank

    with pytest.raises(ValueError, match="outlier factor must be a finite number above 1"):
        dashboard.analyze(_sample(), outlier_factor=factor)
    with pytest.raises(ValueError, match="outlier factor must be a finite number above 1"):
        analyze_by_rank(_sample(), outlier_factor=factor)


def test_the_api_takes_any_real_outlier_factor_above_1():
    assert dashboard.analyze(_sample(), outlier_factor=np.int64(3)).dataloader.outlier_factor == 3.0


def _sample() -> str:
    import os

    from tests.conftest import ROOT

    return os.path.join(ROOT, "examples", "sample-trial", "trial")
