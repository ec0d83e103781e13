"""The whole analysis as per-rank work: each rank's files are read, summarised and assessed by
a worker of their own, and only what the combination needs comes back.

    result = analyze_by_rank("s3://bucket/job/profiler-output", client=dask_client)
    result.verdict, result.budget, result.to_dict()      # as dashboard.analyze gives them

A trial of the reference's format names its processes in its framework files' names, so its
files split by process before anything is read (trial.load.rank_files): each group is one
process's framework files and its host's system files. A task (rank_work) loads its group as
a trial of its own, then returns the facts of it (processes, hosts, span, what it read and
skipped), the DataLoader analyses' summaries (analysis/per_rank.py) and the diagnosis's parts
(analysis/diagnosis: assess_processes). This process never holds more than one task's result
per rank: the events stay where they were read. The tasks run on a Dask cluster's workers
(`client`), which open the trial themselves, else in worker processes forked here
(load.ForkedWorkers), else here one after another; the answers are the same.

What differs from dashboard.analyze on the whole trial: rows of equal value from different
processes that started in the same microsecond are listed in process order (the whole trial
lists them in the order its files were read), and the skipped files in path order. A trial
of torch.profiler traces (processes named only inside the files) is one task.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from .analysis import diagnosis, per_rank
from .analysis.dataloader import DEFAULT_OUTLIER_FACTOR
from .api import TrialAnalysis
from .trial.errors import TrialError, TrialTooLargeError, size_text
from .trial.load import (NOT_A_TRIAL_FILE, ForkedWorkers, LoadReport, RankFiles, SkippedFile, TrialFacts,
                         classify_key, facts_of, load_trial, merge_facts, rank_files)
from .trial.frames import framework_frame
from .trial.store import LocalStore, open_store


@dataclass
class RankWork:
    """What one task sends back: never its events."""
    facts: TrialFacts
    events: int  # framework events and system samples read, for the whole trial's limit
    summaries: list[per_rank.ProcessSummary]
    parts: list[diagnosis.ProcessAssessment]


def rank_work(path: str, group: RankFiles, processes_per_host: dict[str, int], factor: float,
              limits: dict) -> RankWork:
    """One group's task: its files loaded as a trial of their own (a worker opens `path` itself:
    S3 with its own credential chain), summarised and assessed."""
    trial = _load(path, group, limits)
    facts = dataclasses.replace(facts_of(trial), report=trial.report.restricted_to(set(group.owned)))
    parts = diagnosis.assess_processes(trial.framework, trial.system, processes_per_host or None)
    return RankWork(facts, len(trial.framework) + len(trial.system), _summaries(trial.framework, factor), parts)


def _summaries(framework: pd.DataFrame, factor: float,
               thresholds: per_rank.Thresholds | None = None) -> list[per_rank.ProcessSummary]:
    """Each process's summary, its rows indexed by their start: the order the whole trial's
    frame has them in, which decides between equal values across processes (see the module)."""
    starts = framework["start_us"].to_numpy()
    out = []
    for rows in per_rank.process_positions(framework):
        part = framework.take(rows)
        part.index = pd.Index(starts[rows])
        out.append(per_rank.summarise(part, factor, keep_above=thresholds))
    return out


def resummarise(path: str, group: RankFiles, factor: float, limits: dict,
                thresholds: per_rank.Thresholds) -> list[per_rank.ProcessSummary]:
    """A group's summaries again, keeping every row above the job's thresholds (a process much
    slower than the job, whose own cut was above them: per_rank.NarrowSummaryError)."""
    return _summaries(_load(path, group, limits).framework, factor, thresholds)


def _load(path: str, group: RankFiles, limits: dict):
    """The group's files as a trial; limits may name a cache folder (`cache_dir`), which a
    worker opens itself (a columnar_cache.ColumnarFileCache: any process shares it)."""
    limits = dict(limits)
    cache_dir = limits.pop("cache_dir", None)
    if cache_dir is not None:
        from .trial.columnar_cache import ColumnarFileCache

        limits["file_cache"] = ColumnarFileCache(cache_dir)
    return load_trial(path, files=list(group.files), **limits)


@dataclass
class RankedAnalysis(TrialAnalysis):
    """dashboard.analyze's result, made of per-rank work: `trial` is the trial's facts (no
    frames), the assessment the combination of the ranks' parts."""
    combined: diagnosis.Assessment | None = None

    @property
    def assessment(self) -> diagnosis.Assessment:
        return self.combined

    def window(self, *args, **kwargs):
        raise TrialError(f"{self.trial.path}: analyzed by rank, its events stayed with the workers: "
                         "load the trial (dashboard.load_trial) to look at a window of it")


class _InTurn:
    """Tasks run here, one after another (a process with threads, a single core)."""

    def submit(self, fn, *args, pure: bool = False):
        return _Done(fn(*args))

    def shutdown(self) -> None:
        pass


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


def analyze_by_rank(path: str, *, client=None, processes: int | None = None,
                    outlier_factor: float = DEFAULT_OUTLIER_FACTOR, roots: Sequence[str] | None = None,
                    s3_buckets: Sequence[str] | None = None, max_bytes: int | None = None,
                    max_events: int | None = None, max_files: int | None = None,
                    cache_dir: str | None = None) -> RankedAnalysis:
    """dashboard.analyze(path)'s answers, one rank per task (see the module). client: a
    dask.distributed Client; else `processes` forked worker processes where this process may
    fork (load.ForkedWorkers), else here. The limits are the whole trial's; cache_dir: a
    columnar cache folder every task reads and writes (visible to the workers at that path)."""
    store = open_store(path, roots=roots, s3_buckets=s3_buckets)
    files = store.list()
    if max_files is not None and len(files) > max_files:
        raise TrialTooLargeError(f"{path}: trial holds {len(files):,} files, over the limit of {max_files:,} files")
    if max_bytes is not None and sum(info.size for info in files) > max_bytes:
        raise TrialTooLargeError(f"{path}: trial is {size_text(sum(info.size for info in files))}, over the "
                                 f"limit of {size_text(max_bytes)}")
    groups, per_host = rank_files(files)
    canonical = store.canonical_path  # what a worker opens
    # What no task is given: the listing's own skips, and files of no known kind.
    report = LoadReport(files_skipped=[SkippedFile(key, reason) for key, reason in store.skipped]
                        + [SkippedFile(info.key, NOT_A_TRIAL_FILE + ")") for info in files
                           if classify_key(info.key) is None])
    limits = dict(max_bytes=max_bytes, max_events=max_events, cache_dir=cache_dir)
    if client is not None:
        runner = client
    elif processes and processes > 1 and len(groups) > 1 and isinstance(store, LocalStore) \
            and ForkedWorkers.usable():
        runner = ForkedWorkers(min(processes, len(groups)))
    else:
        runner = _InTurn()
    try:
        works = [future.result() for future in
                 [runner.submit(rank_work, canonical, group, per_host, outlier_factor, limits, pure=False)
                  for group in groups]]
        events = sum(work.events for work in works)
        if max_events is not None and events > max_events:
            raise TrialTooLargeError(f"{path}: trial holds {events:,} events, over the limit of {max_events:,}")
        summaries = [s for work in works for s in work.summaries]
        limits_of_job = per_rank.thresholds(summaries, outlier_factor)
        narrow = set(per_rank.too_narrow(summaries, limits_of_job))
        if narrow:
            again, at = {}, 0
            for index, work in enumerate(works):
                mine = range(at, at + len(work.summaries))
                at += len(work.summaries)
                if narrow & set(mine):
                    again[index] = runner.submit(resummarise, canonical, groups[index], outlier_factor, limits,
                                                 limits_of_job, pure=False)
            for index, future in again.items():
                works[index].summaries = future.result()
            summaries = [s for work in works for s in work.summaries]
    finally:
        if runner is not client:
            runner.shutdown()
    facts = merge_facts(path, [work.facts for work in works], report)
    if not summaries:  # no framework events anywhere: the analyses of an empty frame
        summaries = [per_rank.summarise(framework_frame([]), outlier_factor)]
    return RankedAnalysis(trial=facts, dataloader=per_rank.combine(summaries, outlier_factor),
                          combined=diagnosis.combine([part for work in works for part in work.parts]))
