"""The diagnosis's calls frame (loaders._calls_frame, numpy over integer keys) against its
definition in pandas, written out here: the GetNexts sorted (stably) by process label, iterator
and start; each call's place in its iterator; the next call of its process and pid; the compute
to the next call of its iterator."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dashboard
from dashboard import format as fmt
from dashboard import synthetic
from dashboard.analysis.dataloader import call_segments, iterator_classes, labels
from dashboard.analysis.diagnosis import loaders


def calls_frame_by_definition(framework: pd.DataFrame) -> pd.DataFrame:
    # Each GetNext's iterator, aligned by index with the frame's rows (not through
    # getnext_segments, which the code under test reads).
    found = call_segments(framework)
    segment = pd.Series(found.segment, index=framework.index[found.rows], dtype="int64")
    calls = framework[framework["kind"] == fmt.KIND_GETNEXT]
    calls = pd.DataFrame({
        "process": labels(calls["process"], missing="nan"), "pid": calls["pid"].fillna(-1).astype("int64"),
        "cls": iterator_classes(calls["name"]),
        "start_us": calls["start_us"].astype("int64"), "end_us": calls["end_us"].astype("int64"),
        "duration_us": calls["duration_us"].astype("float64"), "worker_id": calls["worker_id"],
        "num_workers": calls["num_workers"], "iterator_id": calls["iterator_id"], "segment": segment},
        index=calls.index)
    calls = calls.sort_values(["process", "segment", "start_us"], kind="stable")
    calls["index"] = calls.groupby("segment", sort=False).cumcount()
    by_process = calls.sort_values(["process", "pid", "start_us"], kind="stable")
    next_start = by_process.groupby(["process", "pid"], sort=False)["start_us"].shift(-1)
    calls["next_start_us"] = next_start.reindex(calls.index).fillna(2**62).astype("int64")
    following = calls.groupby("segment", sort=False)["start_us"].shift(-1)
    calls["compute_us"] = (following - calls["end_us"]).astype("float64")
    return calls


def labels_as_text(calls: pd.DataFrame) -> pd.DataFrame:
    """The calls frame with its process and class labels as the definition's strings: the frame
    holds them as categoricals (3M GetNexts' labels as Python strings were 48 MB)."""
    assert isinstance(calls["process"].dtype, pd.CategoricalDtype) and isinstance(calls["cls"].dtype, pd.CategoricalDtype)
    return calls.astype({"process": object, "cls": object})


@pytest.fixture(scope="module")
def job_frame(tmp_path_factory):
    """8 ranks on 2 hosts, two epochs each (iterators recreated), evaluation iterators too."""
    folder = str(tmp_path_factory.mktemp("calls") / "trial")
    synthetic.write_job(folder, hosts=2, ranks_per_host=4, epochs=2, steps=40)
    return dashboard.load_trial(folder).framework


@pytest.fixture(scope="module")
def trial_frame(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("calls") / "trial")
    synthetic.write_trial(folder, epochs=3, train_batches=30)
    return dashboard.load_trial(folder).framework


@pytest.mark.parametrize("segments", [[], [0], [0, 0, 1, 1, 2], [0, 2, 2], [1, 1, 2], [0, 1, 0], [0, 1, 1, 3],
                                      [3, 3, 4], [0, 0, 0]])
@pytest.mark.parametrize("epochs", [False, True])
def test_a_loaders_iterators_are_numbered_as_factorize_numbers_them(segments, epochs):
    """iterator_codes returns the segments themselves where they are numbered 0.. in order
    already (one loader of one process: no copy), and factorize's numbers otherwise."""
    calls = pd.DataFrame({"segment": np.array(segments, dtype=np.int64)})
    keys = calls["segment"].to_numpy()
    if epochs:
        calls["epoch"] = np.arange(len(segments)) % 2
        keys = pd.MultiIndex.from_arrays([keys, calls["epoch"].to_numpy()])
    codes = loaders.iterator_codes(calls)
    assert codes.tolist() == pd.factorize(keys)[0].tolist()
    in_order = not epochs and segments in ([], [0], [0, 0, 1, 1, 2], [0, 0, 0])
    assert np.shares_memory(codes, calls["segment"].to_numpy()) == (in_order and len(segments) > 0)


@pytest.mark.parametrize("frame", ["job_frame", "trial_frame"])
def test_the_calls_frame_is_its_definition(frame, request):
    framework = request.getfixturevalue(frame)
    assert (framework["kind"] == fmt.KIND_GETNEXT).sum() > 100
    pd.testing.assert_frame_equal(labels_as_text(loaders._calls_frame(framework)), calls_frame_by_definition(framework))


@pytest.mark.parametrize("frame", ["job_frame", "trial_frame"])
def test_the_calls_frame_is_its_definition_on_rows_out_of_order_with_ties_and_unknowns(frame, request):
    """Rows shuffled (the stable sorts keep frame order among ties), equal start times, and
    GetNexts with no process or pid."""
    framework = request.getfixturevalue(frame).sample(frac=1.0, random_state=7)
    framework = framework.copy()
    rng = np.random.default_rng(3)
    getnext = np.flatnonzero((framework["kind"] == fmt.KIND_GETNEXT).to_numpy())
    tied = rng.choice(getnext[1:], size=20, replace=False)
    framework.iloc[tied, framework.columns.get_loc("start_us")] = framework["start_us"].to_numpy()[tied - 1]
    unknown = rng.choice(getnext, size=5, replace=False)
    framework.iloc[unknown, framework.columns.get_loc("pid")] = pd.NA
    framework.iloc[unknown[:2], framework.columns.get_loc("process")] = np.nan
    pd.testing.assert_frame_equal(labels_as_text(loaders._calls_frame(framework)), calls_frame_by_definition(framework))


def test_the_calls_frame_of_a_frame_without_getnexts_is_empty_with_its_columns(trial_frame):
    none = trial_frame[trial_frame["kind"] != fmt.KIND_GETNEXT]
    found = loaders._calls_frame(none)
    assert found.empty
    assert list(found.columns) == list(calls_frame_by_definition(trial_frame).columns)


def _own_steps_by_definition(calls: pd.DataFrame, starts: np.ndarray, ends: np.ndarray) -> list[int]:
    """loaders._own_steps written out a call at a time: the step containing the call, for the
    first call of its pid in that step only, else the first step starting from the call's start
    and before the pid's next call, else -1."""
    seen, out = set(), []
    for call_start, next_start, pid in zip(calls["start_us"], calls["next_start_us"], calls["pid"]):
        before = max((i for i, s in enumerate(starts) if s <= call_start), default=-1)
        containing = before >= 0 and ends[before] > call_start
        after = min((i for i, s in enumerate(starts) if s >= call_start), default=len(starts))
        following = after < len(starts) and starts[after] < next_start
        own = before if containing else after if following else -1
        if containing and (pid, own) in seen:
            own = -1
        seen.add((pid, own))
        out.append(own)
    return out


@pytest.mark.parametrize("in_time_order, pids", [(True, 1), (False, 1), (False, 2)])
@pytest.mark.parametrize("seed", range(6))
def test_each_call_feeds_the_step_the_rule_gives(seed, in_time_order, pids):
    # In time order with one pid, the calls' (pid, step) keys never decrease and _own_steps looks
    # back instead of hashing; shuffled, it hashes the steps (one pid: the step is the key) or
    # the (pid, step) keys (two): each is the rule.
    rng = np.random.default_rng(seed)
    starts = np.sort(rng.choice(np.arange(0, 4000, 10), size=60, replace=False))
    gaps = np.diff(np.r_[starts, 4000])
    ends = starts + np.maximum(1, (gaps * rng.uniform(0.2, 1.0, size=len(starts))).astype(int))  # some gaps
    call_start = np.sort(rng.integers(0, 4000, size=240))  # several calls in most steps
    pid = np.full(len(call_start), 7) if pids == 1 else rng.choice([7, 8], size=len(call_start))
    next_start = np.r_[call_start[1:], 2**62]
    calls = pd.DataFrame({"start_us": call_start, "next_start_us": next_start, "pid": pid})
    if not in_time_order:
        calls = calls.sample(frac=1.0, random_state=seed).reset_index(drop=True)
    got = loaders._own_steps(calls, starts, ends)
    assert got.tolist() == _own_steps_by_definition(calls, starts, ends)
    # Both outcomes, and steps that contain more than one call of a pid (their later calls: -1).
    assert (got >= 0).sum() > 10 and (got == -1).sum() > 0
    contained = [(p, int(np.searchsorted(starts, c, side="right")) - 1) for c, p in zip(calls["start_us"], calls["pid"])
                 if 0 <= np.searchsorted(starts, c, side="right") - 1 and ends[np.searchsorted(starts, c, side="right") - 1] > c]
    assert len(contained) > len(set(contained))


def test_calls_without_a_process_and_of_a_process_named_nan_are_one_process_as_the_definition_has_them():
    # Two codes, one label ("nan"): call_segments keeps them apart (their calls are not in
    # (label, pid, start) order), so the next call of each is found by sorting them again.
    names = ["_MultiProcessingDataLoaderIter::GetNext"] * 4
    framework = pd.DataFrame({
        "process": pd.Categorical([np.nan, "nan", np.nan, "nan"], categories=["nan"]),
        "pid": pd.array([5, 5, 5, 5], dtype="Int64"), "name": pd.Categorical(names),
        "kind": pd.Categorical([fmt.KIND_GETNEXT] * 4), "start_us": [0, 10, 20, 30], "end_us": [5, 15, 25, 35],
        "duration_us": [5, 5, 5, 5], "worker_id": pd.array([0, 1, 0, 1], dtype="Int64"),
        "num_workers": pd.array([None] * 4, dtype="Int64"), "iterator_id": pd.array([None] * 4, dtype="Int64")})
    found = loaders._calls_frame(framework)
    pd.testing.assert_frame_equal(labels_as_text(found), calls_frame_by_definition(framework))
    # The rows by iterator (0, 2, then 1, 3), each with the next call in time of either code.
    assert found["next_start_us"].tolist() == [10, 30, 20, 2**62]


def test_getnexts_of_no_process_are_left_out_of_the_processes_not_a_failure(trial_frame):
    """A frame made by hand may hold GetNexts without a process (a trial's reader gives every
    event its file's): they have no host to be put on, and the processes are those of the
    others, as without them."""
    system = pd.DataFrame(columns=["node", "timestamp_us", "type", "name", "dimension", "value"])
    framework = trial_frame.copy()
    getnext = np.flatnonzero((framework["kind"] == fmt.KIND_GETNEXT).to_numpy())
    process = framework["process"].copy()
    process.iloc[getnext[-3:]] = np.nan
    framework["process"] = process
    found = loaders.processes(framework, system)
    expected = loaders.processes(framework.drop(index=framework.index[getnext[-3:]]), system)
    assert [p.id for p in found] == [p.id for p in expected] and len(found) == 1
    assert [len(loader.calls) for loader in found[0].loaders] == [len(loader.calls) for loader in expected[0].loaders]
    assert not set(framework.index[getnext[-3:]]) & set(found[0].calls.index)


@pytest.mark.parametrize("frame", ["job_frame", "trial_frame"])
def test_each_loaders_calls_are_its_training_iterators_calls_and_one_loader_of_all_shares_them(frame, request):
    """A loader's calls are the calls of the training iterators of its configuration (the
    pandas selection the definition), and the loaders together have every training call once.
    Where one loader has every call of its process, it holds the process's calls themselves, not
    a copy (of 3M GetNexts' calls: about 350 MB beside them)."""
    framework = request.getfixturevalue(frame)
    system = pd.DataFrame(columns=["node", "timestamp_us", "type", "name", "dimension", "value"])
    processes = loaders.processes(framework, system)
    assert processes
    shared = 0
    for process in processes:
        # (the columns read only while they are found are not kept: 4 x 24 MB at 3M GetNexts)
        for kept in (process.calls, *(loader.calls for loader in process.loaders)):
            assert not set(loaders._FINDING_ONLY + loaders._OWN_STEPS_ONLY) & set(kept.columns)
        training = process.calls[np.isin(process.calls["segment"].to_numpy(), process.training_segments)]
        mine = [loader.calls for loader in process.loaders]
        for calls in mine:
            expected = training[np.isin(training["segment"].to_numpy(), calls["segment"].unique())]
            pd.testing.assert_frame_equal(calls, expected)
        together = pd.concat(mine)
        assert sorted(together.index) == sorted(training.index) and together.index.is_unique
        if len(mine) == 1 and len(training) == len(process.calls):
            assert np.shares_memory(mine[0]["start_us"].to_numpy(), process.calls["start_us"].to_numpy())
            shared += 1
    # (the job's ranks train on one loader each and evaluate in none; the trial evaluates too)
    assert shared == (len(processes) if frame == "job_frame" else 0)
