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

What the whole trial knows and one rank's files do not is given back to the tasks that need
it, which run again (replan: at most MAX_ROUNDS rounds, the first reading every group): the
trial's median time, by which far-off events are dropped; which files are copies of another
group's; how many processes with rows each host has (a host of several names the rank); and,
for a rank much slower than the job, the job's outlier thresholds. What still differs from
dashboard.analyze: rows of equal value from two processes that started in the same microsecond
are listed in process order (the whole trial lists them in the order its files were read); the
skipped files are listed in path order; a running job's files that grow between two rounds are
read as they are at each. A trial of torch.profiler traces (processes named only inside the
files) is one task.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

from .analysis import diagnosis, per_rank
from .analysis.dataloader import DEFAULT_OUTLIER_FACTOR, checked_outlier_factor
from .api import TrialAnalysis
from .trial.errors import TrialError, TrialTooLargeError, size_text
from .trial import frames
from .trial.frames import framework_frame
from .trial.load import (NOT_A_TRIAL_FILE, ForkedWorkers, LoadReport, RankFiles, SkippedFile, TrialFacts,
                         classify_key, facts_of, load_trial, merge_facts, near_the_trial, rank_files, trial_center)
from .trial.store import FileInfo, LocalStore, Store, open_store


# Each round re-runs only the groups whose plan the others' work changed: the first reads every
# group; the second leaves out copies, applies the trial's median time and the job's thresholds;
# a third follows where that changed which processes have rows (a host's label count).
MAX_ROUNDS = 4


@dataclass
class RankWork:
    """What one task sends back: never its events."""
    facts: TrialFacts  # its report narrowed to the files it owns (RankFiles.owned)
    summaries: list[per_rank.ProcessSummary]
    parts: list[diagnosis.ProcessAssessment]
    center_us: int | None  # the median time it judged its files by
    dropped_far: bool  # whether that dropped any of its rows (owned files or not)


@dataclass(frozen=True)
class Plan:
    """How a group's task runs: what the whole trial says that its files alone cannot."""
    processes_per_host: tuple[tuple[str, int], ...] = ()  # the labels' counts (a host of several names ranks)
    center_us: int | None = None  # the trial's median time (None: the group's own)
    excluded: frozenset[str] = frozenset()  # copies of files another group reads first
    thresholds: per_rank.Thresholds | None = None  # keep every row above the job's (a far slower rank)


def rank_work(path: str, group: RankFiles, plan: Plan, factor: float, limits: dict) -> RankWork:
    """One group's task: its files loaded as a trial of their own (a worker opens `path` itself:
    S3 with its own credential chain), summarised and assessed as `plan` says."""
    files = [info for info in group.files if info.key not in plan.excluded]
    if not files:
        return RankWork(TrialFacts(path, "smdebug", (), (), LoadReport(), (), None, None), [], [], None, False)
    limits = dict(limits)
    cache_dir = limits.pop("cache_dir", None)
    if cache_dir is not None:  # a worker opens the folder itself: any process shares it
        from .trial.columnar_cache import ColumnarFileCache

        limits["file_cache"] = ColumnarFileCache(cache_dir)
    # dask_client=False: a task on a cluster must not submit tasks of its own to it.
    trial = load_trial(path, files=files, center_us=plan.center_us, dask_client=False, **limits)
    report = trial.report
    dropped = report.center_us is not None and any(
        not near_the_trial(report.center_us, low, high) for _, _, low, high in report.file_times.values())
    parts = diagnosis.assess_processes(trial.framework, trial.system, dict(plan.processes_per_host) or None)
    # Rows ordered by their start: the order the whole trial's frame has them in, which decides
    # between equal values across processes (see the module).
    summaries = per_rank.summaries_of(trial.framework, factor, keep_above=plan.thresholds,
                                      order=trial.framework["start_us"].to_numpy())
    return RankWork(dataclasses.replace(facts_of(trial), report=report.restricted_to(set(group.owned))),
                    summaries, parts, report.center_us, dropped)


def label_counts(whole: Mapping[str, int], own: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """The processes per host a group must be told: those of its hosts where the whole trial
    has another count than the group's own files (where they agree, it counts them itself)."""
    return tuple(sorted((host, whole[host]) for host in own if whole.get(host, own[host]) != own[host]))


def copies_of(works: Sequence[RankWork]) -> dict[str, str]:
    """Files whose content another group's file has, first in path order: {copy: original}, as
    the whole load skips them (copies inside one group, its own load skips already)."""
    digests = {key: digest for work in works for key, digest in work.facts.report.digests.items()}
    owner = {key: index for index, work in enumerate(works) for key in work.facts.report.digests}
    first: dict[bytes, str] = {}
    for key in sorted(digests):
        first.setdefault(digests[key], key)
    return {key: first[digest] for key, digest in digests.items()
            if first[digest] != key and owner[first[digest]] != owner[key]}


def replan(groups: Sequence[RankFiles], works: Sequence[RankWork], plans: Sequence[Plan], factor: float,
           copies: dict[str, str]) -> list[Plan]:
    """The plans that make each group's work what the whole trial's load gives it: copies of
    another group's files left out; its files judged by the whole trial's median time where
    that or its own dropped rows; the labels counted over the processes with rows; and a rank
    cut too high for the job's outliers summarised with the job's thresholds."""
    times = {key: t for work in works for key, t in work.facts.report.file_times.items() if key not in copies}
    center = trial_center([t[0] for t in times.values()], [t[1] for t in times.values()]) if times else None
    hosts = Counter(process.node for work in works for process in work.facts.processes)
    summaries = [s for work in works for s in work.summaries]
    job = per_rank.thresholds(summaries, factor) if summaries else None
    narrow = set(per_rank.too_narrow(summaries, job)) if job is not None else set()
    out, at = [], 0
    for group, work, plan in zip(groups, works, plans):
        mine = set(range(at, at + len(work.summaries)))
        at += len(work.summaries)
        keys = [info.key for info in group.files if info.key not in copies]
        judged = work.center_us == center or (not work.dropped_far and all(
            near_the_trial(center, times[key][2], times[key][3]) for key in keys if key in times))
        out.append(Plan(
            processes_per_host=label_counts(hosts, Counter(p.node for p in work.facts.processes)),
            center_us=plan.center_us if judged else center,
            excluded=plan.excluded | frozenset(info.key for info in group.files if info.key in copies),
            thresholds=job if mine & narrow else plan.thresholds))
    return out
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
                    cache_dir: str | None = None, store: Store | None = None,
                    files: list[FileInfo] | None = None) -> RankedAnalysis:
    """dashboard.analyze(path)'s answers, one rank per task (see the module). client: a
    dask.distributed Client; else `processes` forked worker processes where this process may
    fork (load.ForkedWorkers), else here. The limits are the whole trial's; cache_dir: a
    columnar cache folder every task reads and writes (visible to the workers at that path);
    store and files: the trial's store and its listing, when the caller listed it (else it is
    opened and listed here; the report's skipped files are those of the store's last listing)."""
    outlier_factor = checked_outlier_factor(outlier_factor)
    store = open_store(path, roots=roots, s3_buckets=s3_buckets) if store is None else store
    files = store.list() if files is None else files
    if max_files is not None and len(files) > max_files:
        raise TrialTooLargeError(f"{path}: trial holds {len(files):,} files, over the limit of {max_files:,} files")
    listed = sum(info.size for info in files if classify_key(info.key) is not None)  # as load_trial counts
    if max_bytes is not None and listed > max_bytes:
        raise TrialTooLargeError(f"{path}: trial is {size_text(listed)}, over the limit of {size_text(max_bytes)}")
    groups, per_host = rank_files(files)
    if not any(group.files for group in groups):  # nothing of a trial: load_trial's own refusal
        load_trial(path, store=store, files=files, dask_client=False)
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
    plans = [Plan(processes_per_host=label_counts(per_host, Counter(frames.host_of(p) for p in group.processes)))
             for group in groups]
    works: list[RankWork | None] = [None] * len(groups)
    copies: dict[str, str] = {}
    copy_bytes: dict[str, int] = {}
    try:
        changed = list(range(len(groups)))
        for _ in range(MAX_ROUNDS):
            futures = {index: runner.submit(rank_work, canonical, groups[index], plans[index], outlier_factor,
                                            limits, pure=False) for index in changed}
            for index, future in futures.items():
                works[index] = future.result()
            for key, original in copies_of(works).items():  # (a copy left out is no longer seen: it stays out)
                if key not in copies:
                    copies[key] = original
                    # The whole load counts a copy's bytes against max_bytes before it knows it for one.
                    copy_bytes[key] = next(w.facts.report.bytes_by_path.get(key, 0) for w in works
                                           if key in w.facts.report.digests)
            again = replan(groups, works, plans, outlier_factor, copies)
            changed = [index for index, (old, new) in enumerate(zip(plans, again)) if old != new]
            plans = again
            if not changed:
                break
        else:
            raise TrialError(f"{path}: the ranks' work did not settle in {MAX_ROUNDS} rounds")
    finally:
        if runner is not client:
            runner.shutdown()
    report.files_skipped += [SkippedFile(key, f"duplicate of {original}") for key, original in copies.items()]
    facts = merge_facts(path, [work.facts for work in works], report)
    events = sum(t[1] for key, t in facts.report.file_times.items())
    if max_events is not None and events > max_events:
        raise TrialTooLargeError(f"{path}: trial holds {events:,} events, over the limit of {max_events:,}")
    nbytes = sum(facts.report.bytes_by_path.values()) + sum(copy_bytes.values())
    if max_bytes is not None and nbytes > max_bytes:
        raise TrialTooLargeError(f"{path}: trial is {size_text(nbytes)} once decompressed, over the limit of "
                                 f"{size_text(max_bytes)}")
    summaries = [s for work in works for s in work.summaries]
    if not summaries:  # no framework events anywhere: the analyses of an empty frame
        summaries = [per_rank.summarise(framework_frame([]), outlier_factor)]
    return RankedAnalysis(trial=facts, dataloader=per_rank.combine(summaries, outlier_factor),
                          combined=diagnosis.combine([part for work in works for part in work.parts]))
