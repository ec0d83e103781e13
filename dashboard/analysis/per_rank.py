"""The DataLoader analyses as per-rank work: summarise each process alone, then combine.

`summarise(frame)` reads the events of one process (one rank) and keeps what the analyses of
`dataloader.py` need of them and nothing more: the GetNext durations and batch times as sorted
arrays (8 bytes an event), the few initialization and worker events whole, and the rows that
may turn out to be outliers. `combine(summaries, factor)` then gives what `dataloader.analyze`
gives on the whole frame: the same counts, medians, maxima and thresholds (dataloader.py's own
rules, over the same values) and the same outlier rows in the same order. Only the frames of
every GetNext (`getnext.events`, `batchtime.batches`) come back empty, with their columns:
carrying every event is what the summaries exist not to do; figures read them from the frame.

An outlier is a value above the job's threshold, which no process knows alone (another rank's
values move the median). A summary therefore keeps the rows above a cut of its own
(`Quantity.kept_above`), and is enough for any job threshold at or above it. `combine` refuses
summaries cut too high (NarrowSummaryError); `summarise_by_rank` summarises those processes again
with the job's thresholds, which happens for a process much slower than the job's median, whose
rows are then outliers anyway.

`analyze_by_process(trial, factor, map_fn)` does it all on a loaded trial (`summarise_by_rank`,
then `combine`); `map_fn` may be a process pool's map, or a Dask client's (gathered), since
each summary is one process's work.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from .. import format as fmt
from ..trial.load import Trial
from .dataloader import (BATCH_OUTLIER_COLUMNS, DEFAULT_OUTLIER_FACTOR, GETNEXT_OUTLIER_COLUMNS, BatchTimeResult,
                         DataLoaderAnalysis, DurationStats, _max, _median, analyze_initialization, analyze_workers,
                         batch_times, ints_or, outlier_threshold, rows_above)

# A process keeps as possible outliers its events above this share of its own threshold: enough
# whenever the job's median is at least this share of the process's own (the ranks of a job
# seldom differ more), while keeping a few per cent of the events, not half of them.
KEEP_ABOVE_SHARE = 0.75
# The kinds a summary reads (batch times need the initializations, which split iterators).
SUMMARISED_KINDS = (fmt.KIND_INIT, fmt.KIND_WORKER, fmt.KIND_GETNEXT)


@dataclass(frozen=True)
class Thresholds:
    """The job's outlier thresholds (None: no value to have one)."""
    getnext_us: float | None
    batch_time_s: float | None


@dataclass(frozen=True, eq=False)
class Quantity:
    """One value of a process's events (a GetNext's duration, a batch's time), summarised."""
    count: int  # events, those without a value included (the analyses count events)
    values: np.ndarray  # the known values, sorted, in the frame's dtype
    kept_above: float  # every event whose value is above this is in `candidates`
    candidates: pd.DataFrame  # those events' outlier columns; the index orders equal values

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.candidates.memory_usage(deep=True).sum())


@dataclass(frozen=True, eq=False)
class ProcessSummary:
    """What the DataLoader analyses need of one process's events.

    Indexes order the rows as the trial's frame does (positions, or process_part's order),
    except the batches', which are their order among the process's batches (by start, pid,
    then frame order)."""
    process: str | None
    inits: pd.DataFrame  # the initializations, whole: a few per epoch, and the iterator table needs them
    workers: pd.DataFrame  # the worker events, whole: a few per epoch
    getnext: Quantity  # duration_us; candidates with GETNEXT_OUTLIER_COLUMNS
    batchtime: Quantity  # batch_time_s; candidates with the batch table's columns

    @property
    def nbytes(self) -> int:
        return int(self.inits.memory_usage(deep=True).sum() + self.workers.memory_usage(deep=True).sum()
                   + self.getnext.nbytes + self.batchtime.nbytes)


class NarrowSummaryError(ValueError):
    """Summaries whose kept rows stop above the job's threshold: they may lack outliers."""

    def __init__(self, narrow: list[int], thresholds: Thresholds):
        self.narrow, self.thresholds = narrow, thresholds
        super().__init__(f"{len(narrow)} summaries keep only rows above the job's outlier thresholds "
                         f"({thresholds}): summarise them again with keep_above=the thresholds")


def _quantity(frame: pd.DataFrame, rows: np.ndarray, column: str, candidate_columns: Sequence[str], factor: float,
              keep_above: float | None) -> Quantity:
    """The Quantity of `column` over the frame's `rows` (a mask): only the kept rows are copied
    whole, the others give their value alone."""
    values = frame[column]
    known = values[rows].dropna()
    if keep_above is None:
        own = outlier_threshold(known, factor)  # the rule, on this process alone
        keep_above = -np.inf if own is None else own * KEEP_ABOVE_SHARE if own > 0 else own
    kept = rows & (values > keep_above).to_numpy(dtype=bool, na_value=False)
    return Quantity(count=int(rows.sum()), values=np.sort(known.to_numpy()), kept_above=float(keep_above),
                    candidates=frame.loc[kept, list(candidate_columns)])


def summarise(frame: pd.DataFrame, factor: float = DEFAULT_OUTLIER_FACTOR,
              keep_above: Thresholds | None = None) -> ProcessSummary:
    """The summary of one process's events (any kinds; those of SUMMARISED_KINDS are read).

    The frame's index must be each row's position in the trial's frame, as a part of it taken
    by position keeps it: that order decides between equal outliers, as in the single frame.
    keep_above: the job's thresholds, to keep exactly the rows they need (else a cut of the
    process's own, see KEEP_ABOVE_SHARE)."""
    if frame["process"].nunique(dropna=False) > 1:
        raise ValueError(f"summarise reads one process's events, not {frame['process'].nunique(dropna=False)} "
                         "processes'")
    if not pd.api.types.is_integer_dtype(frame.index.dtype):
        raise ValueError("the frame's index must be the rows' positions in the trial's frame")
    process = frame["process"].iloc[0] if len(frame) else None
    kind = frame["kind"]
    batches = batch_times(frame)
    return ProcessSummary(
        process=None if process is None or pd.isna(process) else str(process),
        inits=frame[(kind == fmt.KIND_INIT).to_numpy()],
        workers=frame[(kind == fmt.KIND_WORKER).to_numpy()],
        getnext=_quantity(frame, (kind == fmt.KIND_GETNEXT).to_numpy(), "duration_us", GETNEXT_OUTLIER_COLUMNS,
                          factor, keep_above.getnext_us if keep_above else None),
        batchtime=_quantity(batches, np.ones(len(batches), dtype=bool), "batch_time_s", batches.columns, factor,
                            keep_above.batch_time_s if keep_above else None))


def _values(quantities: Iterable[Quantity]) -> pd.Series:
    """Every process's values as one Series: the single frame's values, in another order
    (the medians and quantiles of dataloader.py depend on the values alone)."""
    arrays = [q.values for q in quantities]
    return pd.Series(np.concatenate(arrays) if arrays else np.zeros(0))


def thresholds(summaries: Sequence[ProcessSummary], factor: float = DEFAULT_OUTLIER_FACTOR) -> Thresholds:
    """The job's outlier thresholds, as dataloader.outlier_threshold gives them on the whole frame."""
    return Thresholds(outlier_threshold(_values(s.getnext for s in summaries), factor),
                      outlier_threshold(_values(s.batchtime for s in summaries), factor))


def too_narrow(summaries: Sequence[ProcessSummary], limits: Thresholds) -> list[int]:
    """The positions of the summaries that may lack rows above the thresholds."""
    def lacks(quantity: Quantity, limit: float | None) -> bool:
        return limit is not None and quantity.kept_above > limit

    return [i for i, s in enumerate(summaries)
            if lacks(s.getnext, limits.getnext_us) or lacks(s.batchtime, limits.batch_time_s)]


def _in_trial_order(frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Parts of the trial's frame (indexed by position) as one frame in the trial's order."""
    return pd.concat(list(frames)).sort_index(kind="stable")


def _batches_in_trial_order(summaries: Sequence[ProcessSummary]) -> pd.DataFrame:
    """The summaries' kept batches in the single frame's batch order: by start, then process
    (by name, none first), pid (none first), then each process's own order."""
    frames = [s.batchtime.candidates for s in summaries]
    names = sorted({s.process for s in summaries if s.process is not None})
    process_order = {name: i for i, name in enumerate(names)}
    batches = pd.concat(frames)
    process = np.concatenate([np.full(len(f), -1 if s.process is None else process_order[s.process], dtype=np.int64)
                              for s, f in zip(summaries, frames)])
    order = np.lexsort((batches.index.to_numpy(dtype=np.int64), ints_or(batches["pid"], -1), process,
                        batches["start_us"].to_numpy(dtype=np.int64)))
    return batches.iloc[order].reset_index(drop=True)


def combine(summaries: Iterable[ProcessSummary], factor: float = DEFAULT_OUTLIER_FACTOR) -> DataLoaderAnalysis:
    """The DataLoader analysis of the processes summarised: `analyze(frame, factor)`'s numbers
    and outlier rows (see the module's notes on `getnext.events` and `batchtime.batches`).

    Raises NarrowSummaryError where a summary may lack outliers (summarise it again with
    keep_above=thresholds(summaries, factor))."""
    summaries = list(summaries)
    if not summaries:
        raise ValueError("combine needs at least one summary (an empty frame has one, of nothing)")
    limits = thresholds(summaries, factor)
    narrow = too_narrow(summaries, limits)
    if narrow:
        raise NarrowSummaryError(narrow, limits)
    # Initializations and workers are few and kept whole: the single-frame analyses run on them.
    initialization = analyze_initialization(_in_trial_order(s.inits for s in summaries), factor)
    workers = analyze_workers(_in_trial_order(s.workers for s in summaries), factor)
    durations = _values(s.getnext for s in summaries)
    calls = _in_trial_order(s.getnext.candidates for s in summaries)
    getnext = DurationStats(
        count=sum(s.getnext.count for s in summaries), median_us=_median(durations), max_us=_max(durations),
        outliers=rows_above(calls, "duration_us", limits.getnext_us)[GETNEXT_OUTLIER_COLUMNS],
        events=summaries[0].inits.iloc[0:0].reset_index(drop=True))  # the frame's columns, no rows
    batches = _batches_in_trial_order(summaries)
    batchtime = BatchTimeResult(
        count=sum(s.batchtime.count for s in summaries), median_s=_median(_values(s.batchtime for s in summaries)),
        outliers=rows_above(batches, "batch_time_s", limits.batch_time_s)[BATCH_OUTLIER_COLUMNS],
        batches=batches.iloc[0:0])
    return DataLoaderAnalysis(initialization=initialization, workers=workers, getnext=getnext,
                              batchtime=batchtime, outlier_factor=factor)


def process_positions(framework: pd.DataFrame) -> list[np.ndarray]:
    """The positions of each process's rows of SUMMARISED_KINDS (one sort of the category codes,
    not a scan per process), in frame order; rows without a process are one group."""
    rows = np.flatnonzero(framework["kind"].isin(SUMMARISED_KINDS).to_numpy())
    codes = pd.Categorical(framework["process"]).codes[rows].astype(np.int64)
    order = np.argsort(codes, kind="stable")
    rows, codes = rows[order], codes[order]
    bounds = np.flatnonzero(np.diff(codes)) + 1
    return [part for part in np.split(rows, bounds) if len(part)]


def process_part(framework: pd.DataFrame, positions: np.ndarray, order: np.ndarray | None = None) -> pd.DataFrame:
    """The rows at `positions` (one process's: process_positions), as summarise reads them:
    indexed by their positions, or by `order` (per row of the frame: the values that order the
    rows across a whole trial, when the frame is only part of it: dashboard/by_rank.py)."""
    part = framework.take(positions)
    part.index = pd.Index(positions if order is None else np.asarray(order)[positions], dtype=np.int64)
    return part


def summaries_of(framework: pd.DataFrame, factor: float = DEFAULT_OUTLIER_FACTOR,
                 keep_above: Thresholds | None = None, order: np.ndarray | None = None) -> list[ProcessSummary]:
    """The summary of each process of the frame (none for a frame without their events), its
    rows indexed as process_part says."""
    return [summarise(process_part(framework, rows, order), factor, keep_above)
            for rows in process_positions(framework)]


def summarise_by_rank(trial_or_frame: Trial | pd.DataFrame, factor: float = DEFAULT_OUTLIER_FACTOR,
                      map_fn: Callable = map) -> list[ProcessSummary]:
    """Every process's summary, each enough for the job's thresholds (a process cut too high is
    summarised again with them). map_fn(function, parts) runs them: a pool's map, a Dask
    client's (gathered)."""
    framework = trial_or_frame.framework if isinstance(trial_or_frame, Trial) else trial_or_frame
    groups = process_positions(framework) or [np.zeros(0, dtype=np.int64)]  # nothing: one empty part
    summaries = list(map_fn(partial(summarise, factor=factor), (process_part(framework, g) for g in groups)))
    limits = thresholds(summaries, factor)
    narrow = too_narrow(summaries, limits)
    if narrow:
        again = map_fn(partial(summarise, factor=factor, keep_above=limits),
                       [process_part(framework, groups[i]) for i in narrow])
        for i, summary in zip(narrow, again):
            summaries[i] = summary
    return summaries


def analyze_by_process(trial_or_frame: Trial | pd.DataFrame, factor: float = DEFAULT_OUTLIER_FACTOR,
                    map_fn: Callable = map) -> DataLoaderAnalysis:
    """`analyze(framework, factor)`'s numbers and outliers, one process at a time: combine of
    summarise_by_rank."""
    return combine(summarise_by_rank(trial_or_frame, factor, map_fn), factor)
