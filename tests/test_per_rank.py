"""The DataLoader analyses as per-rank work (dashboard/analysis/per_rank.py): summaries of each
process combined give exactly what `dataloader.analyze` gives on the whole frame.

Every trial the project generates is checked: write_trial, the multi-rank write_job (a slow rank
and a slow host among them), the bundled sample trial, a real torch.profiler (Kineto) trace as
two ranks, and frames made to reach the edges (ties across processes, NaN durations, zero
medians, a process without GetNext, one process). Counts, medians and thresholds are compared
with ==, outlier tables row for row."""
from __future__ import annotations

import os
import statistics
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd
import pytest

import dashboard
from dashboard import format as fmt
from dashboard.analysis import dataloader, per_rank
from dashboard.trial.frames import empty_framework_frame
from dashboard.synthetic import write_job, write_trial

from tests.conftest import ROOT

SAMPLE_TRIAL = os.path.join(ROOT, "examples", "sample-trial", "trial")


def summaries_of(framework: pd.DataFrame, factor: float = dataloader.DEFAULT_OUTLIER_FACTOR, keep_above=None):
    return [per_rank.summarise(per_rank.process_part(framework, rows), factor, keep_above)
            for rows in per_rank.process_positions(framework)]


def assert_same(whole: dataloader.DataLoaderAnalysis, combined: dataloader.DataLoaderAnalysis) -> None:
    """Every number and every outlier row of the single-frame analysis, exactly."""
    assert combined.outlier_factor == whole.outlier_factor
    for name in ("initialization", "workers", "getnext"):
        one, other = getattr(whole, name), getattr(combined, name)
        assert (other.count, other.median_us, other.max_us) == (one.count, one.median_us, one.max_us), name
        pd.testing.assert_frame_equal(other.outliers, one.outliers, check_exact=True)
    pd.testing.assert_frame_equal(combined.initialization.iterators, whole.initialization.iterators, check_exact=True)
    pd.testing.assert_frame_equal(combined.initialization.events, whole.initialization.events, check_exact=True)
    pd.testing.assert_frame_equal(combined.workers.events, whole.workers.events, check_exact=True)
    assert (combined.batchtime.count, combined.batchtime.median_s) == (whole.batchtime.count, whole.batchtime.median_s)
    pd.testing.assert_frame_equal(combined.batchtime.outliers, whole.batchtime.outliers, check_exact=True)
    # The every-GetNext frames come back without rows, with the single frame's columns and types.
    pd.testing.assert_frame_equal(combined.getnext.events, whole.getnext.events.iloc[0:0], check_index_type=False)
    pd.testing.assert_frame_equal(combined.batchtime.batches, whole.batchtime.batches.iloc[0:0],
                                  check_index_type=False)


def assert_thresholds_match(framework: pd.DataFrame, factor: float) -> None:
    """The job's thresholds from the summaries are the single frame's, exactly."""
    calls = framework[framework["kind"] == fmt.KIND_GETNEXT]
    expected = per_rank.Thresholds(
        dataloader.outlier_threshold(calls["duration_us"], factor),
        dataloader.outlier_threshold(dataloader.batch_times(framework)["batch_time_s"], factor))
    assert per_rank.thresholds(summaries_of(framework, factor), factor) == expected


def check(framework: pd.DataFrame, factor: float = dataloader.DEFAULT_OUTLIER_FACTOR):
    whole = dataloader.analyze(framework, factor)
    assert_same(whole, per_rank.analyze_by_process(framework, factor))
    assert_thresholds_match(framework, factor)
    return whole


def duplicated_process(framework: pd.DataFrame, process: str, host: str) -> pd.DataFrame:
    """The frame with a copy of every row under another process and host: every value of one
    process ties with one of the other, as two identical ranks' would. Sorted by start as a
    load sorts (stable: the original first)."""
    copy = framework.copy()
    copy["process"], copy["node"] = process, host
    both = pd.concat([framework.astype({"process": str, "node": str}), copy.astype({"process": str, "node": str})],
                     ignore_index=True)
    # Categories in reverse order of name, as a load may list them (its files' order): the
    # summaries then come in another order than the single frame's ties.
    for column in ("process", "node"):
        both[column] = pd.Categorical(both[column], categories=sorted(set(both[column]), reverse=True))
    return both.iloc[np.argsort(both["start_us"].to_numpy(), kind="stable")].reset_index(drop=True)


@pytest.fixture(scope="module")
def single_host(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("single_host"))
    write_trial(folder, hosts=1, slow_batches={(0, 3): 9_000, (2, 7): 15_000})
    return dashboard.load_trial(folder)


@pytest.mark.parametrize("options", [
    dict(hosts=1),
    dict(hosts=3, epochs=2, slow_batches={(0, 3): 9_000, (1, 4): 9_000}, slow_worker=1, slow_worker_factor=2.5),
    dict(hosts=2, num_workers=0, val_batches=0, pin_memory=True),
], ids=["one-host", "three-hosts-slow", "single-process-loaders"])
def test_write_trial(tmp_path, options):
    write_trial(str(tmp_path), **options)
    check(dashboard.load_trial(str(tmp_path)).framework)


@pytest.mark.parametrize("options", [
    dict(hosts=2, ranks_per_host=4, steps=60),
    dict(hosts=2, ranks_per_host=4, steps=60, slow_rank=5, seed=1),
    dict(hosts=3, ranks_per_host=2, steps=41, slow_storage_host=2, record_ranks=False),
], ids=["even", "slow-rank", "slow-host-ranks-from-node-ids"])
def test_write_job(tmp_path, options):
    write_job(str(tmp_path), system=False, **options)
    trial = dashboard.load_trial(str(tmp_path))
    assert len(trial.processes) == options["hosts"] * options["ranks_per_host"]
    for factor in (2.0, 1.2):
        whole = check(trial.framework, factor)
        assert whole.getnext.count == options["hosts"] * options["ranks_per_host"] * 2 * options["steps"]


def test_the_sample_trial():
    trial = dashboard.load_trial(SAMPLE_TRIAL)
    for factor in (2.0, 1.1, 3.0):
        whole = check(trial.framework, factor)
        assert len(whole.getnext.outliers) and len(whole.batchtime.outliers)  # outliers were compared


@pytest.mark.torch
def test_a_kineto_trace_as_two_identical_ranks(tmp_path):
    """A real torch.profiler trace, written as ranks 0 and 1 of a job: every value ties across
    the two processes, so the order of equal outliers is checked too."""
    import orjson
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.arange(96.0).reshape(48, 2)), batch_size=4, num_workers=0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            for _batch in loader:
                pass
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    trace = orjson.loads((tmp_path / "trace.json").read_bytes())
    (tmp_path / "trace.json").unlink()
    for rank in (0, 1):
        (tmp_path / f"rank-{rank}.json").write_bytes(orjson.dumps(
            {**trace, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2}}))
    trial = dashboard.load_trial(str(tmp_path))
    assert trial.format == "kineto" and [p.rank for p in trial.processes] == [0, 1]
    for factor in (2.0, 1.0, 0.5):
        whole = check(trial.framework, factor)
    assert whole.getnext.count == 2 * 2 * (12 + 1)  # 12 batches and the StopIteration, 2 epochs, 2 ranks
    assert len(whole.getnext.outliers) >= 2


def test_equal_values_on_two_processes_keep_the_single_frames_order(single_host):
    framework = duplicated_process(single_host.framework, "20009-algo-9", "algo-9")
    whole = check(framework)
    # Each outlier twice, once per process, in the frame's order (the original first).
    assert len(whole.getnext.outliers) == 2 * len(dataloader.analyze(single_host.framework).getnext.outliers) > 0
    assert list(whole.getnext.outliers["node"].astype(str)[:2]) == ["algo-1", "algo-9"]
    # Equal batches start together: the process's name decides (the original's sorts first).
    loose = check(framework, 1.05)
    assert len(loose.batchtime.outliers) >= 2
    assert list(loose.batchtime.outliers["node"].astype(str)[:2]) == ["algo-1", "algo-9"]


def test_one_process(single_host):
    framework = single_host.framework
    [summary] = summaries_of(framework)
    assert summary.process == str(framework["process"].iloc[0])
    assert_same(dataloader.analyze(framework), per_rank.combine([summary]))
    check(framework, 1.1)


def test_an_even_count_takes_the_mean_of_the_two_middle_values(single_host):
    framework = single_host.framework
    durations = sorted(int(d) for d in framework.loc[framework["kind"] == fmt.KIND_GETNEXT, "duration_us"])
    if len(durations) % 2:  # make it even: drop the last GetNext
        last = np.flatnonzero((framework["kind"] == fmt.KIND_GETNEXT).to_numpy())[-1]
        framework = framework.drop(index=framework.index[last]).reset_index(drop=True)
        durations = sorted(int(d) for d in framework.loc[framework["kind"] == fmt.KIND_GETNEXT, "duration_us"])
    assert len(durations) % 2 == 0
    middle = len(durations) // 2
    combined = per_rank.analyze_by_process(duplicated_process(framework, "20009-algo-9", "algo-9"))
    assert combined.getnext.median_us == (durations[middle - 1] + durations[middle]) / 2
    assert combined.getnext.count == 2 * len(durations)
    check(framework)


def test_a_process_without_getnext(tmp_path):
    write_trial(str(tmp_path), hosts=3, epochs=2)
    framework = dashboard.load_trial(str(tmp_path)).framework
    quiet = (framework["node"] == "algo-2").to_numpy()
    no_calls = framework[~(quiet & (framework["kind"] == fmt.KIND_GETNEXT).to_numpy())].reset_index(drop=True)
    whole = check(no_calls)
    summaries = summaries_of(no_calls)
    [empty] = [s for s in summaries if s.process.endswith("-algo-2")]
    assert empty.getnext.count == empty.batchtime.count == 0 and len(empty.inits) == 2 * 2
    assert whole.getnext.count == 2 * 2 * (20 + 5)
    # A process with no event that a summary reads (steps only) has no summary, and no effect.
    steps_only = framework[~(quiet & framework["kind"].isin(per_rank.SUMMARISED_KINDS).to_numpy())]
    assert len(per_rank.process_positions(steps_only)) == 2
    check(steps_only.reset_index(drop=True))


def test_nan_durations_count_as_events_but_have_no_value(single_host):
    """The canonical frame's durations are never null; a frame whose are (float, NaN) is
    analysed alike either way: counted, never a median's value, never an outlier."""
    framework = duplicated_process(single_host.framework, "20009-algo-9", "algo-9")
    framework["duration_us"] = framework["duration_us"].astype(np.float64)
    calls = np.flatnonzero((framework["kind"] == fmt.KIND_GETNEXT).to_numpy())
    inits = np.flatnonzero((framework["kind"] == fmt.KIND_INIT).to_numpy())
    unknown = np.concatenate([calls[::7], inits[:1]])
    framework.loc[framework.index[unknown], "duration_us"] = np.nan
    whole = check(framework)
    check(framework, 1.1)
    known = [d for d in framework["duration_us"].to_numpy()[calls] if not np.isnan(d)]
    assert whole.getnext.count == len(calls) and whole.getnext.median_us == statistics.median(known)


def test_zero_medians_use_the_far_out_fence(single_host):
    """Most GetNexts take 0 us (a coarse timer): the threshold is Tukey's fence, on both paths."""
    framework = duplicated_process(single_host.framework, "20009-algo-9", "algo-9")
    calls = np.flatnonzero((framework["kind"] == fmt.KIND_GETNEXT).to_numpy())
    zero = calls[np.arange(len(calls)) % 5 < 4]
    framework.loc[framework.index[zero], "end_us"] = framework["start_us"].to_numpy()[zero]
    framework.loc[framework.index[zero], "duration_us"] = 0
    whole = check(framework)
    assert whole.getnext.median_us == 0 and len(whole.getnext.outliers) > 0


def test_a_slow_rank_needs_its_summary_again_with_the_jobs_threshold(tmp_path):
    write_job(str(tmp_path), hosts=2, ranks_per_host=4, steps=60, slow_rank=3, system=False)
    framework = dashboard.load_trial(str(tmp_path)).framework
    summaries = summaries_of(framework)
    with pytest.raises(per_rank.NarrowSummaryError) as raised:
        per_rank.combine(summaries)
    assert [summaries[i].process for i in raised.value.narrow] == ["3-algo-1"]
    limits = per_rank.thresholds(summaries)
    assert raised.value.thresholds == limits
    again = summaries_of(framework, keep_above=limits)
    whole = dataloader.analyze(framework)
    assert_same(whole, per_rank.combine(again))
    # summarise_by_rank does so for that process alone.
    by_rank = per_rank.summarise_by_rank(framework)
    assert [s.process for s in by_rank if s.getnext.kept_above == limits.getnext_us] == ["3-algo-1"]
    assert_same(whole, per_rank.combine(by_rank))
    # Every one of the slow rank's GetNexts is an outlier (its waits are 8-12 ms, the job's ~1 ms).
    assert len(whole.getnext.outliers) == 2 * 60 and set(whole.getnext.outliers["rank"]) == {3}


def test_a_summary_reads_one_process(single_host):
    framework = duplicated_process(single_host.framework, "20009-algo-9", "algo-9")
    with pytest.raises(ValueError, match="one process"):
        per_rank.summarise(framework)
    with pytest.raises(ValueError, match="positions"):
        per_rank.summarise(single_host.framework.set_axis(single_host.framework.index.astype(str)))


def test_an_empty_frame():
    framework = empty_framework_frame()
    check(framework)
    assert per_rank.analyze_by_process(framework).getnext.median_us is None
    with pytest.raises(ValueError):
        per_rank.combine([])


def test_summaries_run_in_a_process_pool(tmp_path):
    write_job(str(tmp_path), hosts=2, ranks_per_host=2, steps=30, slow_rank=1, system=False)
    trial = dashboard.load_trial(str(tmp_path))
    with ProcessPoolExecutor(max_workers=2) as pool:
        assert_same(dataloader.analyze(trial.framework), per_rank.analyze_by_process(trial, map_fn=pool.map))


def test_summaries_of_a_64_rank_job_are_a_fraction_of_its_frame(tmp_path):
    write_job(str(tmp_path), hosts=8, ranks_per_host=8, steps=200, system=False, seed=3)
    framework = dashboard.load_trial(str(tmp_path)).framework
    summaries = per_rank.summarise_by_rank(framework)
    assert len(summaries) == 64
    summary_bytes = sum(s.nbytes for s in summaries)
    assert summary_bytes < framework.memory_usage(deep=True).sum() / 5
    assert_same(dataloader.analyze(framework), per_rank.combine(summaries))
