"""Verdict and findings on real torch.profiler traces of CPU training loops with planted
problems. The loop times its own next() calls; the expected numbers come from that."""
from __future__ import annotations

import json
import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader, Dataset, get_worker_info

import dashboard
from dashboard import report
from dashboard.web import views
from dashboard.analysis.diagnosis import loaders

pytestmark = pytest.mark.torch
MP_NEXT = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


class Samples(Dataset):
    """n samples; each takes `sleep_s` to load (only on worker `slow_worker`, if given)."""

    def __init__(self, n, sleep_s=0.0, slow_worker=None):
        self.n, self.sleep_s, self.slow_worker = n, sleep_s, slow_worker

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = get_worker_info()
        if self.sleep_s and (self.slow_worker is None or (info is not None and info.id == self.slow_worker)):
            time.sleep(self.sleep_s)
        return torch.full((8,), float(i))


def slow_worker_init(_):
    time.sleep(0.6)


def timed(loader, calls):
    """The loader's batches; appends each next() call's (start, end), in perf_counter seconds,
    the one that ends the epoch (StopIteration) included."""
    it = iter(loader)
    while True:
        start = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            calls.append((start, time.perf_counter()))
            return
        calls.append((start, time.perf_counter()))
        yield batch


def profiled_run(folder, loader, compute_s):
    """One epoch; the 'GPU' step is a sleep after a small CPU forward/backward. Returns the
    loop's own timing of its next() calls: [(start, end)] in perf_counter seconds."""
    model = torch.nn.Linear(8, 8)
    calls = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in timed(loader, calls):
            model(batch).sum().backward()
            time.sleep(compute_s)
    prof.export_chrome_trace(str(folder / "run.pt.trace.json"))
    return calls


def recorded_next_s(folder) -> list[float]:
    """The multi-process loader's __next__ events of the trace in `folder`, in time order, as
    seconds: read here with json, not with the project's reader."""
    with open(folder / "run.pt.trace.json") as handle:
        events = [e for e in json.load(handle)["traceEvents"] if e.get("ph") == "X" and e.get("name") == MP_NEXT]
    return [e["dur"] / 1e6 for e in sorted(events, key=lambda e: e["ts"])]


def measured_percent(calls) -> float:
    """Share of the time from the first next() to the end of the last spent inside next()."""
    return 100.0 * sum(e - s for s, e in calls) / (calls[-1][1] - calls[0][0])


def test_single_process_loader_input_bound(tmp_path):
    calls = profiled_run(tmp_path, DataLoader(Samples(40, sleep_s=0.01), batch_size=2, num_workers=0), 0.005)
    result = dashboard.analyze(str(tmp_path))
    assert result.trial.format == "kineto"
    assert result.verdict.input_percent == pytest.approx(measured_percent(calls), abs=3)
    assert result.verdict.class_ == "highly"
    items = {r.id: r for r in result.recommendations}
    assert set(items) == {"use_workers"}
    found = items["use_workers"]
    assert found.evidence["num_workers"] == 0
    assert found.evidence["batches"] == len(calls)
    # load time per batch over compute per batch, at least 2 (~20 ms / ~5 ms here)
    assert found.evidence["suggested_num_workers"] >= 2
    assert 0 < found.saving_s <= round(result.verdict.getnext_s, 3)  # never more than the wait
    assert "num_workers=" in found.text


def test_one_slow_worker_shows_as_a_stall_every_two_batches(tmp_path):
    loader = DataLoader(Samples(48, sleep_s=0.03, slow_worker=1), batch_size=2, num_workers=2)
    calls = profiled_run(tmp_path, loader, 0.01)
    result = dashboard.analyze(str(tmp_path))
    items = {r.id: r for r in result.recommendations}
    found = items["slow_worker"]
    # The trace does not record the worker count: the stalls' period gives it.
    assert found.evidence["num_workers"] == 2 and found.evidence["num_workers_inferred"] is True
    assert found.evidence["worker_id"] == 1  # batch i goes to worker i mod 2
    # the stalled batches are worker 1's, the odd ones (the loop's own timing says so too)
    waits = [e - s for s, e in calls]
    odd = range(1, len(calls) - 1, 2)  # not the last: StopIteration
    assert sum(waits[i] > 0.015 for i in odd) >= 0.8 * len(odd)
    listed = [b["batch"] for b in found.evidence["batches"]]
    assert all(b % 2 == 1 for b in listed) and len(listed) >= 0.8 * len(odd)
    recorded = recorded_next_s(tmp_path)
    assert len(recorded) == len(calls)
    for item in found.evidence["batches"]:
        assert item["duration_s"] == pytest.approx(recorded[item["batch"]], abs=2e-6)
        # the wait the loop saw, up to what its own timing adds around next() (a preemption
        # there on a loaded host is a few ms)
        assert item["duration_s"] == pytest.approx(waits[item["batch"]], abs=0.02)
    assert not {"more_workers", "use_workers"} & set(items)  # the slow worker is the fix


class SlowSampleAt(Samples):
    """Samples, one of which (`at`) takes `extra_s` more to load."""

    def __init__(self, n, at, extra_s, **kwargs):
        super().__init__(n, **kwargs)
        self.at, self.extra_s = at, extra_s

    def __getitem__(self, i):
        if i == self.at:
            time.sleep(self.extra_s)
        return super().__getitem__(i)


def test_a_slow_sample_stands_beyond_its_workers_spread(tmp_path):
    """A slow worker 1 gives the count; one sample of worker 0 takes 150 ms more (batch 10: the
    loop's books saw 26-36 ms of it in 9 runs, quiet and with two busy processes, the rest hidden
    by the batches worker 0 had ready). It is a slow sample: beyond 2x its worker's steady wait
    and beyond that wait's own spread (budget.TAIL_SPREAD_DEVIATIONS)."""
    loader = DataLoader(SlowSampleAt(48, 20, 0.15, sleep_s=0.03, slow_worker=1), batch_size=2, num_workers=2)
    calls = profiled_run(tmp_path, loader, 0.01)
    result = dashboard.analyze(str(tmp_path))
    items = {r.id: r for r in result.recommendations}
    assert items["slow_worker"].evidence["worker_id"] == 1
    listed = [b["batch"] for b in items["slow_samples"].evidence["batches"]]
    waits = [e - s for s, e in calls]
    assert listed[0] == 10  # the longest listed (a busy host adds a short one now and then)
    steady_worker_0 = [waits[i] for i in range(2, len(calls) - 1, 2) if i != 10]
    assert waits[10] > 2 * sorted(steady_worker_0)[len(steady_worker_0) // 2] + 0.01


def test_a_recording_that_saw_the_iterator_created_places_its_rounds_however_quick_its_first_batch(tmp_path):
    """Persistent workers, a shuffling sampler, and only the second epoch recorded, after a pause
    in which the workers readied their first batches: its first batch came about as quick as a
    ready one (the loop's books, quiet: 1.5-2.2 ms in 8 runs; 3-4x the ready batches' 0.39-0.48 ms
    in the 4 where both were kept), where 5x is what a first batch must take to count as a fresh
    start by its wait alone, and this epoch's workers, long started, never pay that. What says
    the recording saw the iterator begin is the sampler's seed draw just before it (an epoch of
    persistent workers draws no iterator seed; a shuffling sampler draws its own): without it
    (shuffle=False), the same run got no worker count and no finding."""
    loader = DataLoader(Samples(48, sleep_s=0.03, slow_worker=1), batch_size=2, num_workers=2,
                        persistent_workers=True, shuffle=True)
    for _ in loader:  # the first epoch: the workers start, unrecorded
        pass
    model = torch.nn.Linear(8, 8)
    calls = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        it = iter(loader)
        time.sleep(0.2)  # worker 1's two primed batches take 0.12 s
        for batch in timed(it, calls):
            model(batch).sum().backward()
            time.sleep(0.01)
    prof.export_chrome_trace(str(tmp_path / "run.pt.trace.json"))
    result = dashboard.analyze(str(tmp_path), assess=True)
    [process] = loaders.processes(result.trial.framework, result.trial.system)
    [mp_loader] = process.loaders
    assert mp_loader.seen_from_start == frozenset(mp_loader.calls["segment"].unique().tolist())
    items = {r.id: r for r in result.recommendations}
    found = items["slow_worker"]
    assert found.evidence["num_workers"] == 2 and found.evidence["num_workers_inferred"] is True
    assert found.evidence["worker_id"] == 1  # batch i of the epoch goes to worker i mod 2
    waits = [e - s for s, e in calls]
    # Worker 1's batches after the 4 the pause let the workers ready (prefetch_factor 2 x 2
    # workers), not the last call (StopIteration).
    odd = range(5, len(calls) - 1, 2)
    listed = [b["batch"] for b in found.evidence["batches"]]
    assert all(b % 2 == 1 for b in listed) and len(set(listed) & set(odd)) >= 0.8 * len(odd)
    # The loop's books agree: 10 of 10 of those batches waited over 15 ms in 4 quiet runs, 9 of
    # 10 in 5 runs with two `yes` (batch 5, whose fetch began in the pause, waited 7-14 ms); the
    # finding listed 10 of 10 in all.
    assert sum(waits[i] > 0.015 for i in odd) >= 0.8 * len(odd)


def test_a_recording_of_two_epochs_places_each_epochs_rounds_from_its_own_start(tmp_path):
    """Two epochs of one loader in one recording are one run of __next__ events: nothing in the
    trace marks the second epoch's start. An epoch of 26 batches and the call that raises
    StopIteration is 27 calls, so counting on from the first epoch put the second epoch's
    rounds one batch off: worker 1 was named slow "with 4.8 ms of waiting against 26.8 ms for
    the others", beside a `more_workers` finding. Each epoch starts its round at worker 0
    (torch's _reset), and the stalls show where the second one began."""
    loader = DataLoader(Samples(52, sleep_s=0.03, slow_worker=1), batch_size=2, num_workers=2)
    model = torch.nn.Linear(8, 8)
    calls = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            for batch in timed(loader, calls):
                model(batch).sum().backward()
                time.sleep(0.01)
    prof.export_chrome_trace(str(tmp_path / "run.pt.trace.json"))
    per_epoch = len(loader) + 1  # its batches and the StopIteration call
    assert len(calls) == 2 * per_epoch and per_epoch % 2 == 1
    result = dashboard.analyze(str(tmp_path))
    items = {r.id: r for r in result.recommendations}
    found = items["slow_worker"]
    assert found.evidence["num_workers"] == 2 and found.evidence["worker_id"] == 1
    assert not {"more_workers", "slow_samples"} & set(items)
    [loader_budget] = result.assessment.budget
    assert loader_budget.evidence["iterators"] == 2
    # Worker 1's batches of each epoch, as the loop's books number them: the odd ones of each
    # epoch (not its last call, StopIteration). In quiet runs every one waited over 15 ms.
    waits = [e - s for s, e in calls]
    odd = {(epoch, b) for epoch in (1, 2) for b in range(1, per_epoch - 1, 2)}
    assert sum(waits[(epoch - 1) * per_epoch + b] > 0.015 for epoch, b in odd) >= 0.8 * len(odd)
    listed = [(item["iterator"], item["batch"]) for item in found.evidence["batches"]]
    assert set(listed) <= odd and {epoch for epoch, _ in listed} == {1, 2}
    recorded = recorded_next_s(tmp_path)
    for item in found.evidence["batches"]:
        at = (item["iterator"] - 1) * per_epoch + item["batch"]
        assert item["duration_s"] == pytest.approx(recorded[at], abs=2e-6)
        assert item["duration_s"] == pytest.approx(waits[at], abs=0.02)  # (the loop's timing: as above)


@pytest.mark.parametrize("drawn", [8, 9])
def test_a_recording_begun_mid_epoch_names_no_worker_and_no_worker_count(tmp_path, drawn):
    """The iterator made and `drawn` batches taken before the profiler starts: the trace cannot
    tell which batch of the epoch its first one is. With 9 drawn, the first recorded batch (the
    slow worker's) waited 3.8 ms against 0.2 ms for ready ones; a first batch 5x a ready one
    was once taken for the epoch's start, so worker 1's stalls were placed on worker 0 and the
    finding was "the workers cannot keep up: 6 workers" (with 8 drawn: no finding). Neither is
    known: no worker count, no finding that needs one, no start-up where no start was seen, and
    the page says why there is no finding."""
    loader = DataLoader(Samples(120, sleep_s=0.03, slow_worker=1), batch_size=2, num_workers=2)
    it = iter(loader)
    for _ in range(drawn):
        next(it)
    model = torch.nn.Linear(8, 8)
    calls = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in timed(it, calls):
            model(batch).sum().backward()
            time.sleep(0.01)
    prof.export_chrome_trace(str(tmp_path / "run.pt.trace.json"))
    result = dashboard.analyze(str(tmp_path))
    # The loop's books: worker 1's batches (odd in the epoch) stalled, so the job waited.
    waits = [e - s for s, e in calls]
    worker_1 = range(1 - drawn % 2, len(calls) - 1, 2)
    assert sum(waits[i] > 0.015 for i in worker_1) >= 0.8 * len(worker_1)
    assert result.verdict.input_percent == pytest.approx(measured_percent(calls), abs=3)
    assert result.recommendations == []
    [loader_budget] = result.assessment.budget
    assert loader_budget.evidence["num_workers"] is None and "num_workers unknown" in loader_budget.loader
    assert loader_budget.parts["startup"] == 0.0
    assert loader_budget.parts["throughput"] == pytest.approx(result.verdict.getnext_s, abs=1e-3)
    text = report.to_text(result)
    assert "Findings: none (num_workers is not recorded" in text and "Start recording before the epoch's loop" in text
    # and the page, in the same words
    summary = views.verdict_summary(views.trial_view(result.trial))
    assert summary["findings"] == [] and summary["no_findings"] == loader_budget.evidence["no_findings_reason"]
    assert "Start recording before the epoch's loop" in summary["no_findings"]


def test_slow_worker_start_is_start_up_cost(tmp_path):
    loader = DataLoader(Samples(48), batch_size=2, num_workers=2, worker_init_fn=slow_worker_init)
    calls = profiled_run(tmp_path, loader, 0.01)
    result = dashboard.analyze(str(tmp_path))
    items = {r.id: r for r in result.recommendations}
    # (whether the steady batches also wait depends on what else runs on the machine)
    assert not {"persistent_workers", "use_workers", "slow_worker"} & set(items)
    found = items["startup"]
    first_s = calls[0][1] - calls[0][0]
    assert first_s >= 0.3  # 0.6 s of worker_init_fn, less what ran during iter() (the fork)
    assert found.evidence["first_batch_s"] == pytest.approx(first_s, abs=0.02)
    assert found.evidence["iterators"] == 1
    assert "worker_init_fn" in found.text
    # The recording saw the iterator begin: whatever it could not replay, it never asks the user
    # to start recording earlier.
    assert [b.evidence.get("no_findings_reason") for b in result.assessment.budget] == [None]


def test_clean_run_gets_no_findings(tmp_path):
    # Single-process on purpose: with workers, a run this short on a shared 2-core machine is
    # genuinely input-bound whenever other processes take the cores (the planted clean trial
    # in test_verdict.py covers workers without that noise).
    # 50 ms of compute per batch keeps a clean run well below the 5 % line even when other
    # processes slow next() down (at 20 ms, a loaded machine pushed it to 6 %).
    calls = profiled_run(tmp_path, DataLoader(Samples(60), batch_size=2, num_workers=0), 0.05)
    result = dashboard.analyze(str(tmp_path))
    assert result.verdict.input_percent == pytest.approx(measured_percent(calls), abs=2)
    assert result.verdict.class_ == "not"
    assert result.recommendations == []


def test_profiler_steps_tell_training_from_a_validation_loop_inside_them(tmp_path):
    """prof.step() per training batch: the validation loop runs inside a training step and
    waits a lot; its GetNexts and its time are not training's."""
    from torch.profiler import schedule

    train = DataLoader(Samples(24, sleep_s=0.005), batch_size=2, num_workers=2)
    val = DataLoader(Samples(12, sleep_s=0.02), batch_size=2, num_workers=0)
    model = torch.nn.Linear(8, 8)
    train_calls, val_spans = [], []

    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=0, warmup=0, active=10_000)) as prof:
        begin = time.perf_counter()
        for _ in range(2):
            for batch in timed(train, train_calls):
                model(batch).sum().backward()
                time.sleep(0.01)
                prof.step()
            val_calls = []
            for batch in timed(val, val_calls):
                model(batch)
            val_spans.append((val_calls[0][0], val_calls[-1][1]))
        end = time.perf_counter()
    prof.export_chrome_trace(str(tmp_path / "run.pt.trace.json"))

    result = dashboard.analyze(str(tmp_path))
    steps = result.trial.framework[result.trial.framework["kind"] == "step"]
    assert len(steps) == 2 * 12 + 1  # one per prof.step(), and the one open at exit
    wait = sum(e - s for s, e in train_calls)
    # steps run back to back from the profiler's start to its end; the val loops are taken out
    training = (end - begin) - sum(e - s for s, e in val_spans)
    # Exactly the training loader's __next__ events of the trace: the validation loader's
    # GetNexts are not training's wait.
    assert result.verdict.getnext_s == pytest.approx(sum(recorded_next_s(tmp_path)), abs=1e-5)
    # And that is the wait the loop saw, up to what its own timing adds around each next():
    # a preemption there on a loaded host (a few ms) counts, as in the training time below.
    assert result.verdict.getnext_s == pytest.approx(wait, abs=0.02)
    assert result.verdict.training_s == pytest.approx(training, abs=0.02)
    assert result.verdict.input_percent == pytest.approx(100 * wait / training, abs=2)
    assert "training steps" in result.verdict.basis
