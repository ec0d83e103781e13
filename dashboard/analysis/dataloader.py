"""The DataLoader analyses: pure functions from the canonical frames to results.

No I/O, no printing. Times are absolute epoch microseconds; durations microseconds,
batch times seconds. An outlier is a value above `factor` x the median (the
reference's rule, factor 2 by default).
"""
from __future__ import annotations

import math
import numbers

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .. import format as fmt
from ..trial.frames import take_column, take_rows

DEFAULT_OUTLIER_FACTOR = 2.0


def checked_outlier_factor(value) -> float:
    """An outlier factor: a finite number above 1 (an outlier lies above that x the median; at
    1 or less every value at the median or above would be one, NaN or inf none); ValueError
    otherwise, saying so."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 1:
        raise ValueError(f"the outlier factor must be a finite number above 1, not {value!r}")
    return float(value)
# Event and metric filters are short names; a huge pattern only costs the server time.
MAX_PATTERN_CHARS = 1000
# RE2's reasons for refusing lookaround ("(?=", "(?<!"), backreferences ("\1") and atomic or
# possessive groups ("(?>", "a++"): syntax Python's `re` reads and RE2, linear in time, has not.
RE2_LEFT_OUT = ("invalid perl operator", "invalid escape sequence", "bad repetition operator")
# `node` is the host; `rank` the training rank where known (see trial/frames.py).
INIT_OUTLIER_COLUMNS = ["start_us", "end_us", "duration_us", "node", "rank", "pid", "type"]
WORKER_OUTLIER_COLUMNS = ["start_us", "end_us", "duration_us", "worker_id", "pid", "node", "rank"]
GETNEXT_OUTLIER_COLUMNS = ["start_us", "end_us", "duration_us", "worker_id", "pid", "node", "rank"]
BATCH_OUTLIER_COLUMNS = ["start_us", "end_us", "batch_time_s", "pid", "node", "rank", "worker_id"]


def outlier_threshold(values: pd.Series, factor: float = DEFAULT_OUTLIER_FACTOR,
                      median: float | None = None) -> float | None:
    """Values above this are outliers: factor x median (`median`: _median(values), when the
    caller has it already: 30 ms each at 3M GetNexts).

    A zero median (a timer too coarse, or batches served from a prefetch queue) would make
    every non-zero value an outlier; then Tukey's far-out fence (Q3 + 3 IQR) is used,
    which still catches the rare long value among many zeros.
    """
    median = _median(values) if median is None else median
    if median is None:
        return None
    if median > 0:
        return factor * median
    q1, q3 = (float(q) for q in values.dropna().quantile([0.25, 0.75]))
    return q3 + 3 * (q3 - q1)


def outliers(frame: pd.DataFrame, column: str, factor: float, median: float | None = None) -> pd.DataFrame:
    """Rows of `frame` whose `column` is above the threshold, longest first (`median`: the
    column's, when already computed)."""
    return rows_above(frame, column, outlier_threshold(frame[column], factor, median))


def rows_above(frame: pd.DataFrame, column: str, threshold: float | None) -> pd.DataFrame:
    """Rows of `frame` whose `column` is above `threshold` (none when it is None), longest
    first, equal values in the frame's order."""
    if threshold is None:
        return frame.iloc[0:0]
    found = frame[frame[column] > threshold]
    return found.sort_values(column, ascending=False, kind="stable").reset_index(drop=True)


def _median(series: pd.Series) -> float | None:
    """The median of the values that are not missing: numpy's, as pandas' (which converts the
    values and masks them first: twice the time at 3M GetNexts)."""
    values = series.to_numpy(dtype=np.float64, na_value=np.nan)
    values = values[~np.isnan(values)]  # (a copy of its own: the median may reorder it)
    return float(np.median(values, overwrite_input=True)) if len(values) else None


def _max(series: pd.Series) -> float | None:
    series = series.dropna()
    return float(series.max()) if len(series) else None


def iterator_class(name: str) -> str:
    """'_MultiProcessingDataLoaderIter::GetNext' -> '_MultiProcessingDataLoaderIter'."""
    return re.split(r"::|\.(?=__init__$|worker$|__next__$)", name, maxsplit=1)[0]


def per_category(values: pd.Series, label, missing: str) -> tuple[np.ndarray, np.ndarray]:
    """(label(str(value)) of each distinct value, then `missing`; the row's index into it).
    label runs once per distinct value, not per row."""
    values = values if values.dtype.name == "category" else values.astype("category")
    per_value = np.array([label(str(c)) for c in values.cat.categories] + [missing], dtype=object)
    return per_value, values.cat.codes.to_numpy()


def labels(values: pd.Series, label=str, missing: str = "") -> pd.Series:
    """label(str(value)) of each row as Python strings, computed once per distinct value
    (object dtype: a str column would copy every row into Arrow)."""
    per_value, codes = per_category(values, label, missing)
    return pd.Series(per_value[codes], index=values.index, dtype=object)


def loader_name(cls: str) -> str:
    """An iterator class as the diagnosis names loaders: without Kineto's 'enumerate(...)#'."""
    return cls.split("#", 1)[1] if cls.startswith("enumerate(") else cls


def iterator_classes(names: pd.Series) -> pd.Series:
    """iterator_class of each name."""
    return labels(names, iterator_class)


# --- results ---------------------------------------------------------------------------

@dataclass
class DurationStats:
    count: int
    median_us: float | None
    max_us: float | None
    outliers: pd.DataFrame
    events: pd.DataFrame  # every event of this kind, for figures


@dataclass
class InitializationResult(DurationStats):
    # One row per iterator class and configuration: type, num_workers, pin_memory,
    # count, median_us, max_us.
    iterators: pd.DataFrame = field(default_factory=pd.DataFrame)


@dataclass
class BatchTimeResult:
    count: int
    median_s: float | None
    outliers: pd.DataFrame
    # Every GetNext with its batch time (NaN for the first of an iterator).
    batches: pd.DataFrame


@dataclass
class Window:
    start_us: int | None  # None: unbounded on that side
    end_us: int | None
    system: pd.DataFrame
    framework: pd.DataFrame


@dataclass
class DataLoaderAnalysis:
    initialization: InitializationResult
    workers: DurationStats
    getnext: DurationStats
    batchtime: BatchTimeResult
    outlier_factor: float


# --- the analyses ------------------------------------------------------------------------

def _of_kind(framework: pd.DataFrame, kind: str) -> pd.DataFrame:
    return take_rows(framework, np.flatnonzero((framework["kind"] == kind).to_numpy()))


def analyze_initialization(framework: pd.DataFrame,
                           factor: float = DEFAULT_OUTLIER_FACTOR) -> InitializationResult:
    inits = _of_kind(framework, fmt.KIND_INIT).copy()
    inits["type"] = iterator_classes(inits["name"])
    keys = ["type", "num_workers", "pin_memory"]
    if len(inits):
        iterators = (inits.groupby(keys, dropna=False, observed=True)["duration_us"]
                     .agg(count="size", median_us="median", max_us="max").reset_index())
    else:
        iterators = pd.DataFrame(columns=keys + ["count", "median_us", "max_us"])
    return InitializationResult(
        count=len(inits), median_us=(median := _median(inits["duration_us"])), max_us=_max(inits["duration_us"]),
        outliers=outliers(inits, "duration_us", factor, median)[INIT_OUTLIER_COLUMNS],
        events=inits.reset_index(drop=True), iterators=iterators)


def analyze_workers(framework: pd.DataFrame, factor: float = DEFAULT_OUTLIER_FACTOR,
                    events: bool = True) -> DurationStats:
    return _duration_stats(framework, fmt.KIND_WORKER, factor, WORKER_OUTLIER_COLUMNS, events)


def analyze_getnext(framework: pd.DataFrame, factor: float = DEFAULT_OUTLIER_FACTOR,
                    events: bool = True) -> DurationStats:
    return _duration_stats(framework, fmt.KIND_GETNEXT, factor, GETNEXT_OUTLIER_COLUMNS, events)


def _duration_stats(framework: pd.DataFrame, kind: str, factor: float, outlier_columns: list[str],
                    events: bool) -> DurationStats:
    """The durations of the events of a kind: read at their rows, and only the outliers' rows
    taken whole (all of 3M GetNexts' columns were 255 MB and 0.2 s); every event taken as well
    where `events` (for figures), else none (their columns alone)."""
    rows = np.flatnonzero((framework["kind"] == kind).to_numpy())
    durations = pd.Series(framework["duration_us"].to_numpy()[rows])
    median = _median(durations)
    threshold = outlier_threshold(durations, factor, median)
    above = rows[(durations > threshold).to_numpy()] if threshold is not None else rows[:0]
    return DurationStats(
        count=len(rows), median_us=median, max_us=_max(durations),
        outliers=rows_above(take_rows(framework, above), "duration_us", threshold)[outlier_columns],
        events=take_rows(framework, rows if events else rows[:0]).reset_index(drop=True))


def _codes(values: pd.Series, rows: np.ndarray) -> np.ndarray:
    """Integer codes of a column at those rows, whose order follows its values' order (missing: -1)."""
    if values.dtype.name != "category":
        values = values.astype("category")  # categories come sorted
    codes = values.cat.codes.to_numpy()[rows].astype(np.int64)
    categories = values.cat.categories
    if len(categories) > 1 and not categories.is_monotonic_increasing:
        rank = np.empty(len(categories), dtype=np.int64)
        rank[np.argsort(categories.astype(str), kind="stable")] = np.arange(len(categories))
        codes = np.where(codes >= 0, rank[codes], -1)
    return codes


def _class_codes(names: pd.Series, rows: np.ndarray) -> np.ndarray:
    """An id per row (of those rows) for iterator_class(name), computed once per distinct name."""
    per_name, codes = per_category(names, iterator_class, "")
    return pd.factorize(per_name)[0][codes[rows]]


def ints_or(values: pd.Series, missing: int) -> np.ndarray:
    """An integer column (pid, worker id) as int64, `missing` where it is not known."""
    return values.to_numpy(dtype=np.int64, na_value=missing)


@dataclass
class CallSegments:
    """The GetNext calls in (process, pid, start) order, with the iterator each belongs to; the
    calls of iterators the trial names (call_segments) after the other calls of their process
    and pid, each iterator's together, in the order of their first calls.
    Computed once per analysis (call_segments) and handed to what reads it: the batch times
    and the diagnosis's calls frame (0.8 s at 3M GetNexts, each time)."""
    rows: np.ndarray  # positions of the calls in the framework frame, in this order
    segment: np.ndarray  # iterator number per call in this order, from 0: each a run of equal numbers
    start_us: np.ndarray


def lexsort_or_none(*keys: np.ndarray) -> np.ndarray | None:
    """np.lexsort(keys) (the last key the most significant), or None where the rows are in
    that order already: a frame's rows are by start time, and its calls mostly of one process,
    so the sorts of the calls below most often leave every row where it is, at 0.1-0.2 s each
    for 3M GetNexts, and a check is a few passes over the keys."""
    ahead = np.zeros(max(len(keys[0]) - 1, 0), dtype=bool)  # decided by a more significant key
    for key in reversed(keys):
        after, before = key[1:], key[:-1]
        if np.any(~ahead & (after < before)):
            return np.lexsort(keys)
        ahead |= after > before
    return None


def ordered_by(order: np.ndarray | None, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """The arrays in lexsort_or_none's order (as they are where it gave None)."""
    return arrays if order is None else tuple(array[order] for array in arrays)


def call_segments(framework: pd.DataFrame) -> CallSegments:
    # Numpy over the few columns needed, not pandas group-bys over copied frames: this runs
    # on every GetNext of a trial (300k+), and its temporary frames once set the peak memory.
    # (Each column read at these rows only, and each key put in order once: reading whole
    # columns of the frame, then the rows, was a third of this at 3M GetNexts.)
    is_call = (framework["kind"] == fmt.KIND_GETNEXT).to_numpy()
    rows = np.flatnonzero(is_call | (framework["kind"] == fmt.KIND_INIT).to_numpy())
    calls_first = is_call[rows]
    process = _codes(framework["process"], rows)
    pid = ints_or(framework["pid"].iloc[rows], -1)
    cls = _class_codes(framework["name"], rows)
    start = framework["start_us"].to_numpy(dtype=np.int64)[rows]
    init_at = np.flatnonzero(~calls_first)
    init_ids = ints_or(framework["iterator_id"].iloc[rows[init_at]], -1)
    # Initializations of the call's class on the call's process that started before it (or
    # at the same time): a change in that count starts a new iterator. (Those that name their
    # iterator's id name the iterators they start: they end none of another id.)
    counted = ~calls_first
    counted[init_at[init_ids >= 0]] = False
    order = lexsort_or_none(calls_first, start, cls, pid, process)
    process_in, pid_in, cls_in, init_in = ordered_by(order, process, pid, cls, counted)
    same_group = np.zeros(len(rows), dtype=bool)
    same_group[1:] = ((process_in[1:] == process_in[:-1]) & (pid_in[1:] == pid_in[:-1])
                      & (cls_in[1:] == cls_in[:-1]))
    del process_in, pid_in, cls_in
    inits_seen = np.cumsum(init_in)
    group_base = np.where(same_group, 0, inits_seen - init_in)
    inits_before = inits_seen - np.maximum.accumulate(group_base)  # (in the sorted order)
    if order is not None:
        inits_before, in_order = np.empty_like(inits_before), inits_before
        inits_before[order] = in_order
    # The calls alone, by process and time.
    call_rows = np.flatnonzero(calls_first)
    init_keys = (process[init_at], pid[init_at], init_ids)
    # (A mask, not call_rows: a gather of 3M of 6M rows five times took 0.2 s.)
    process, pid, cls, start, inits_before = (a[calls_first] for a in (process, pid, cls, start, inits_before))
    iterator_id = ints_or(framework["iterator_id"].iloc[rows[call_rows]], -1)
    recorded, iterator = _recorded_iterators(process, pid, iterator_id, cls, *init_keys)
    order = lexsort_or_none(start, pid, process)
    if iterator is not None:
        # An iterator the trial names (its process's initializations name their iterators' ids)
        # is one segment however the calls of others interleave with its own: zip(loader_a,
        # loader_b) alternates two iterators call by call, and runs of equal keys made each call
        # an iterator of its own (240 "iterators" of one batch, all their waits a start-up's); a
        # validation pass split a training epoch in three. Its calls are put together, after the
        # other calls of its process and pid, in the order of the iterators' first calls; an
        # iterator created while it runs does not split it. The other calls make their runs
        # among themselves.
        inits_before = np.where(recorded, -1, inits_before)
        in_time = ordered_by(order, process, pid, start, recorded, iterator)
        regrouped = lexsort_or_none(in_time[2], in_time[4], _first_start(in_time[2], in_time[3], in_time[4]),
                                    in_time[3], in_time[1], in_time[0])
        del in_time
        if regrouped is not None:
            order = regrouped if order is None else order[regrouped]
    new = np.zeros(len(call_rows), dtype=bool)
    new[:1] = True
    for key in ordered_by(order, process, pid, cls, inits_before, iterator_id):
        new[1:] |= key[1:] != key[:-1]
    call_rows, start = ordered_by(order, rows[call_rows], start)
    # Numbered from 0: one loader of one process then has its iterators numbered as the
    # pipeline model numbers them (loaders.iterator_codes), which holds this array, not a copy.
    segment = np.cumsum(new)
    segment -= 1
    return CallSegments(rows=call_rows, segment=segment, start_us=start)


def _recorded_iterators(process: np.ndarray, pid: np.ndarray, iterator_id: np.ndarray, cls: np.ndarray,
                        init_process: np.ndarray, init_pid: np.ndarray, init_iterator_id: np.ndarray,
                        ) -> tuple[np.ndarray, np.ndarray | None]:
    """Which calls name their iterator: those with an iterator_id, of a process and pid whose
    initializations carry iterator ids (this project's collector numbers every iter() so, its
    calls and initializations alike; an iterator made before the recording began has an id
    and no initialization). A Kineto trace's iterator_id numbers its recording, and it records
    no initialization; a reference trial records no id. For those calls, a number per
    iterator: per process, pid, id and class (calls of two classes under one id are damaged,
    and each class's its own iterator); -1 for the other calls. (None, None) where no call
    names one."""
    known = init_iterator_id >= 0
    if not known.any():  # (a reference trial, a Kineto trace: no full-length mask made)
        return None, None
    calls = len(iterator_id)
    pair = _key_codes(np.concatenate([process, init_process[known]]), np.concatenate([pid, init_pid[known]]))
    recorded = (iterator_id >= 0) & np.isin(pair[:calls], pair[calls:])
    if not recorded.any():
        return None, None
    return recorded, np.where(recorded, _key_codes(pair[:calls], iterator_id, cls), -1)


def _key_codes(*keys: np.ndarray) -> np.ndarray:
    """A number per row for its combination of the keys' values (equal where all are equal).
    A key of one value adds nothing (the calls of one process: most trials), and no key is
    combined as a tuple per row (3M GetNexts' MultiIndex took 2 s)."""
    codes = None
    for key in keys:
        if len(key) and (key == key[0]).all():
            continue
        key_codes, uniques = pd.factorize(key)
        codes = key_codes if codes is None else pd.factorize(codes * len(uniques) + key_codes)[0]
    return np.zeros(len(keys[0]), dtype=np.int64) if codes is None else codes.astype(np.int64, copy=False)


def _first_start(start: np.ndarray, recorded: np.ndarray, iterator: np.ndarray) -> np.ndarray:
    """Per call (by process, pid and start), the start of its recorded iterator's first call;
    its own start where its iterator is not recorded."""
    at = np.flatnonzero(recorded)
    first = np.empty(iterator.max() + 1, dtype=np.int64)
    first[iterator[at[::-1]]] = start[at[::-1]]  # (the last write is the earliest call's)
    first_start = start.copy()
    first_start[at] = first[iterator[at]]
    return first_start


def iterator_segments(framework: pd.DataFrame) -> pd.Series:
    """An id per GetNext naming the iterator that served it (index-aligned with the GetNexts).

    Two GetNexts share an id only if they come from one process on one node, from the same
    iterator class, with no initialization of that class on that process between them
    and no GetNext of another class between them. Events of this project's collector
    carry an explicit iterator_id, which then also splits persistent-worker epochs; where the
    process's initializations carry ids too, the id (and class) alone decides, whatever calls
    of other iterators or initializations come between (zip(loader_a, loader_b) alternates
    two; a validation pass inside an epoch).
    """
    rows, segment = getnext_segments(framework)
    return pd.Series(segment, index=framework.index[rows], dtype="int64")


def getnext_segments(framework: pd.DataFrame, found: CallSegments | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(the GetNexts' positions in the frame, in frame order; the iterator id of each), as
    iterator_segments has them. `found`: the frame's call_segments, when already computed."""
    found = found if found is not None else call_segments(framework)
    in_frame_order = np.argsort(found.rows)  # found.rows are exactly the GetNexts' positions
    return found.rows[in_frame_order], found.segment[in_frame_order]


def analyze_batchtime(framework: pd.DataFrame, factor: float = DEFAULT_OUTLIER_FACTOR,
                      found: CallSegments | None = None, events: bool = True) -> BatchTimeResult:
    """BatchTime_in_seconds: start of the next GetNext minus start of this one, per iterator
    (see batch_times). The batches' frame is made for the outliers' rows alone, and for every
    batch where `events` (for figures), else for none."""
    batches = _BatchArrays.of(framework, found)
    seconds = pd.Series(batches.seconds)
    median = _median(seconds)
    threshold = outlier_threshold(seconds, factor, median)
    above = (seconds > threshold).to_numpy() if threshold is not None else _NO_BATCH
    return BatchTimeResult(
        count=len(seconds), median_s=median,
        outliers=rows_above(batches.frame(framework, above), "batch_time_s", threshold)[BATCH_OUTLIER_COLUMNS],
        batches=batches.frame(framework, None if events else _NO_BATCH))


def batch_times(framework: pd.DataFrame, found: CallSegments | None = None) -> pd.DataFrame:
    """Every GetNext that has a next one in its iterator, with its batch time, by start (then
    process, pid and frame order).

    Each batch is attributed to the interval [this start, next start]: the time the training
    loop spent on this batch, fetch included. The last GetNext of an iterator has none.
    """
    return _BatchArrays.of(framework, found).frame(framework)


# No batch: what _BatchArrays.frame takes for the batches of no outlier, or for none.
_NO_BATCH = slice(0, 0)


@dataclass
class _BatchArrays:
    """batch_times' rows as arrays: the GetNexts' positions in the frame, their start, the next
    GetNext's start, their iterator."""
    rows: np.ndarray
    start: np.ndarray
    end: np.ndarray
    segment: np.ndarray

    COLUMNS = ["start_us", "end_us", "batch_time_s", "pid", "node", "rank", "worker_id", "segment"]

    @classmethod
    def of(cls, framework: pd.DataFrame, found: CallSegments | None) -> "_BatchArrays":
        found = found if found is not None else call_segments(framework)
        has_next = found.segment[1:] == found.segment[:-1]
        arrays = (found.rows[:-1][has_next], found.start_us[:-1][has_next], found.start_us[1:][has_next],
                  found.segment[:-1][has_next])
        # (One process's calls: by start already.)
        return cls(*ordered_by(lexsort_or_none(arrays[1]), *arrays))

    @cached_property
    def seconds(self) -> np.ndarray:
        return (self.end - self.start) / 1e6

    def frame(self, framework: pd.DataFrame, which: np.ndarray | slice | None = None) -> pd.DataFrame:
        """The batches' frame, of the batches `which` says (a mask or a slice; None: all)."""
        which = slice(None) if which is None else which
        rows, start, end, segment, seconds = (self.rows[which], self.start[which], self.end[which],
                                              self.segment[which], self.seconds[which])
        return pd.DataFrame({
            "start_us": start, "end_us": end, "batch_time_s": seconds,
            **{name: take_column(framework[name].array, rows) for name in ("pid", "node", "rank", "worker_id")},
            "segment": segment}, columns=self.COLUMNS, copy=False)


def _matches_any(values: pd.Series, patterns: Sequence[str]) -> pd.Series:
    """Rows whose value matches one of the regexes (searched, like the reference's match_inc).

    Matched by RE2 (pyarrow.compute), in time linear in the text: a pattern typed in the page
    runs in the server, and Python's backtracking `re` (which pandas falls back to for
    lookaround) held the GIL for minutes on `(?=.{0,26}$)(.+)+#`, stalling every request."""
    patterns = list(patterns or [".*"])
    combined = "|".join(f"(?:{p})" for p in patterns)
    if values.dtype.name == "category":
        # Match each category once, then look rows up by code (-1, missing, picks False).
        cats = values.cat.categories.astype(str)
        hit = np.append(_regex_hits(cats, combined, patterns), False)
        return pd.Series(hit[values.cat.codes.to_numpy()], index=values.index)
    return pd.Series(_regex_hits(values.astype(str), combined, patterns), index=values.index)


def _regex_hits(texts, combined: str, patterns: Sequence[str]) -> np.ndarray:
    """Whether RE2 finds `combined` in each text (a missing one: False); a pattern RE2 cannot
    run is the ValueError of validate_patterns (a caller may not have validated)."""
    try:
        hits = pc.match_substring_regex(pa.array(texts, type=pa.large_string(), from_pandas=True), combined)
    except pa.ArrowInvalid:
        validate_patterns(patterns)
        raise
    return np.asarray(hits.fill_null(False), dtype=bool)


def validate_patterns(patterns: Sequence[str]) -> list[str]:
    """The patterns, or ValueError naming the first that is not a regex _matches_any can run:
    the check is RE2's own, so that what passes here is what the filter matches with."""
    patterns = [p for p in (patterns or []) if p] or [".*"]
    for pattern in patterns:
        if len(pattern) > MAX_PATTERN_CHARS:
            raise ValueError(f"regular expression of {len(pattern):,} characters: the limit is "
                             f"{MAX_PATTERN_CHARS:,}")
        try:
            pc.match_substring_regex(pa.array([""], type=pa.large_string()), pattern)
        except pa.ArrowInvalid as exc:
            reason = str(exc).removeprefix("Invalid regular expression: ")
            if reason.startswith(RE2_LEFT_OUT):  # Python's syntax that RE2 leaves out: say so
                reason += ("; lookaround, backreferences and atomic or possessive groups are not "
                           "supported (the filter matches in linear time)")
            raise ValueError(f"invalid regular expression {pattern!r}: {reason}") from None
    return patterns


def window(framework: pd.DataFrame, system: pd.DataFrame, start_us: int | None, end_us: int | None,
           select_events: Sequence[str] = (".*",), select_dimensions: Sequence[str] = (".*",)) -> Window:
    """System samples and framework events inside [start_us, end_us].

    select_events filters framework events by name or phase; select_dimensions filters
    system metrics by dimension, name or type ("CPUUtilization", "gpu0", "i/o").
    Framework events overlapping the window are kept whole (not clipped).
    """
    select_events = validate_patterns(select_events)
    select_dimensions = validate_patterns(select_dimensions)
    lo = -2**62 if start_us is None else int(start_us)
    hi = 2**62 if end_us is None else int(end_us)
    ts = system["timestamp_us"].to_numpy()
    sys_in = system[(ts >= lo) & (ts <= hi)]
    keep = (_matches_any(sys_in["dimension"], select_dimensions)
            | _matches_any(sys_in["name"], select_dimensions)
            | _matches_any(sys_in["type"], select_dimensions))
    fw_in = framework[(framework["end_us"].to_numpy() >= lo) & (framework["start_us"].to_numpy() <= hi)]
    keep_fw = _matches_any(fw_in["name"], select_events) | _matches_any(fw_in["phase"], select_events)
    return Window(None if start_us is None else lo, None if end_us is None else hi,
                  sys_in[keep.to_numpy()].reset_index(drop=True),
                  fw_in[keep_fw.to_numpy()].reset_index(drop=True))


def analyze(framework: pd.DataFrame, factor: float = DEFAULT_OUTLIER_FACTOR,
            found: CallSegments | None = None, events: bool = True) -> DataLoaderAnalysis:
    """The four panels' analyses. `found`: the frame's call_segments, when already computed.
    events=False: the workers', GetNexts' and batches' frames (getnext.events, batchtime.batches,
    ...) come back empty, with their columns, as the by-rank path returns them: for a caller that
    reads only the counts, medians and outliers (`app.py analyze`)."""
    return DataLoaderAnalysis(
        initialization=analyze_initialization(framework, factor),
        workers=analyze_workers(framework, factor, events),
        getnext=analyze_getnext(framework, factor, events),
        batchtime=analyze_batchtime(framework, factor, found, events),
        outlier_factor=factor)
