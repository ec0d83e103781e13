"""Which loaders trained, and for how long: the frames turned into processes, loaders and
training windows, the one definition of training time that the verdict, the budget and
the what-if share.

A loader is the training iterators of one DataLoader configuration on one process; iterators of
one configuration that run side by side (zip(labeled, unlabeled)) are of different loaders. An
iterator is a training one when most of its batches feed training steps (smdebug's
`Step:ModeKeys.TRAIN`, after the GetNext; Kineto's `ProfilerStep#N`, around it, first
GetNext of the step only); without step events every iterator counts.

Training time is the union of the training iterators' windows of a process, less the spans
of evaluation iterators inside them. A window runs from the iterator's first GetNext
(or the start of the step it fed, when earlier) to the end of the last step any of its
batches fed: each step counted whole, so a short trace is not biased by leaving its last
step's compute out. Without steps it runs to the end of the last GetNext plus the
iterator's median compute between two GetNexts (an estimate, and the result says so).

Everything is vectorised over GetNexts and iterators: a job that calls iter() every few
steps has 100,000 iterators.
"""
from __future__ import annotations

import dataclasses

import re
from collections import Counter, deque
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from ... import format as fmt
from ...trial.frames import identity_order, take_column
from ...trial.load import processes_of
from ..dataloader import (CallSegments, call_segments, ints_or, iterator_class, iterator_classes, labels,
                          lexsort_or_none, loader_name, ordered_by, per_category)

# Torch's default prefetch_factor with workers (DataLoader.__init__).
TORCH_DEFAULT_PREFETCH = 2
# A recorded worker count beyond these is a damaged value, not a DataLoader's (torch refuses a
# negative one; a host runs no thousands of worker processes for one loader): it is ignored,
# and the count found as where none was recorded (the GetNexts' own, the workers they name). Kept,
# 5,000,000 sized the model's per-worker arrays and loops (a 180 kB trial took 60-84 s), and -3
# failed the whole analysis. The same for a worker id that would make such a count, and for a
# prefetch_factor below torch's least, 1, or beyond what fills any host's memory (2**62 overflowed
# the model's arithmetic).
MAX_RECORDED_WORKERS = 4096
MAX_RECORDED_PREFETCH = 4096
_EVAL_RE = re.compile(r"EVAL|PREDICT", re.IGNORECASE)
_FAR = 2**62  # "no next GetNext"
# The calls frame's columns read only while the processes and their loaders are found (each
# call's process label, pid, iterator class, recorded workers and the step it fed):
# the frames the processes and loaders keep leave them out (24 MB each at 3M GetNexts, the two
# labels' categorical codes 3 MB; alive through the assessment otherwise).
_FINDING_ONLY = ["process", "pid", "cls", "num_workers", "own_step", "training"]
# ...and those read only to find each call's own step, left out before the rest is found.
_OWN_STEPS_ONLY = ["next_start_us"]


@dataclass
class Loader:
    """The training iterators of one DataLoader configuration on one process."""
    process: str  # the process id (trial/frames.py)
    pid: int
    cls: str
    num_workers: int | None
    pin_memory: bool | None
    persistent: bool | None  # recorded (collector) or inferred from re-creations; None: unknown
    persistent_recorded: bool
    prefetch_factor: int  # recorded, else torch's default
    in_order: bool  # recorded, else torch's default (True)
    # Its training GetNexts in (segment, start) order: start_us, end_us, duration_us,
    # worker_id, segment, index (within the iterator), iterator_id, compute_us (the main
    # process's time from this GetNext's end to the next one's start; NaN for the last).
    # Where rounds.inferred_rounds placed a trace's batches: index is the batch's number in its
    # epoch, and `epoch` numbers the epochs of a segment (iterator_codes).
    calls: pd.DataFrame
    num_workers_inferred: bool = False  # not recorded: read from the period of its stalls
    # Its segments whose iterator's creation the trial shows just before their first GetNext
    # (an initialization; Kineto's `created` events): their first batch is the iterator's first.
    seen_from_start: frozenset[int] = frozenset()
    # When each initialization its iterators were matched to began: its own, not those of a loader
    # of the same class with other settings (a train and a validation loader).
    init_starts_us: frozenset[int] = frozenset()
    # Where loaders of these settings on this process ran side by side (zip(labeled, unlabeled)):
    # which of them this is (1, 2, ...: in the order of their first batches) and how many.
    alike: tuple[int, int] | None = None

    @property
    def name(self) -> str:
        """The iterator class, without Kineto's 'enumerate(DataLoader)#' prefix."""
        return loader_name(self.cls)

    @property
    def label(self) -> str:
        workers = ("num_workers unknown" if self.num_workers is None else
                   f"num_workers={self.num_workers}, inferred" if self.num_workers_inferred else
                   f"num_workers={self.num_workers}")
        alike = f", {_ordinal(self.alike[0])} of {self.alike[1]} alike" if self.alike else ""
        return f"{self.name} ({workers}{alike})"

    @property
    def records_stop_iteration(self) -> bool:
        """torch.profiler's `enumerate(DataLoader)#...__next__` includes the call that ends
        the epoch; the reference's and the collector's GetNext do not."""
        return self.cls.startswith("enumerate(")

    @property
    def multi_process(self) -> bool:
        return bool(self.num_workers) or (self.num_workers is None and fmt.SINGLE_PROCESS_ITER not in self.cls)

    @cached_property
    def segments(self) -> int:
        """Its iterators (epochs)."""
        return int(iterator_codes(self.calls).max(initial=-1)) + 1

    @cached_property
    def wait_us(self) -> float:
        return float(self.calls["duration_us"].sum())



def _ordinal(number: int) -> str:
    return f"{number}{'th' if 10 <= number % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(number % 10, 'th')}"


def iterator_codes(calls: pd.DataFrame) -> np.ndarray:
    """Each call's iterator, numbered 0.. in the calls' order: its segment, and within a segment
    the epoch where rounds.inferred_rounds found several (a trace that does not mark iterators)."""
    keys = calls["segment"].to_numpy()
    if "epoch" in calls:
        keys = pd.MultiIndex.from_arrays([keys, calls["epoch"].to_numpy()])
    elif _numbered_in_order(keys):
        # Already factorize's answer (one loader of one process): the same array, not its
        # copy (24 MB at 3M GetNexts, held by the pipeline model through the assessment).
        return keys
    return pd.factorize(keys)[0]


def _numbered_in_order(keys: np.ndarray) -> bool:
    """Whether keys are 0, 1, 2, ... in order, each repeated: non-decreasing from 0 by steps of
    at most 1 (then each step that changes them is one, and they end at the changes' count)."""
    if not len(keys):
        return True
    if keys.dtype != np.intp or keys[0] != 0:
        return False
    return (bool(np.all(keys[1:] >= keys[:-1]))
            and int(keys[-1]) == int(np.count_nonzero(keys[1:] != keys[:-1])))


@dataclass
class ProcessTraining:
    """One process's training: a rank of the job, or the one process of a job not distributed."""
    id: str  # the process id (trial/frames.py)
    host: str
    rank: int | None
    pid: int
    label: str  # how texts name it: the host, with the rank or pid where the host has several
    span_us: int  # first to last framework event
    calls: pd.DataFrame  # every GetNext of the process, with its segment and index (see Loader.calls)
    inits: pd.DataFrame
    training_segments: np.ndarray
    windows: list[tuple[int, int]]  # merged training windows
    has_steps: bool
    steps_matched: bool
    training_estimated: bool  # the windows' ends include an estimated last compute
    segment_windows: pd.DataFrame  # per training iterator (index: segment): lo, hi
    loaders: list[Loader]
    cpu: pd.Series  # mean CPUUtilization over cores, by timestamp_us
    iowait: pd.Series
    cores: int | None
    gpus: int
    fetches: pd.DataFrame  # worker-side fetch events (collector), else empty
    verdict: object = field(default=None)

    @property
    def training_us(self) -> int:
        return int(sum(e - s for s, e in self.windows))

    @cached_property
    def training_cpu_percent(self) -> float | None:
        """The host's mean CPU use over its cores during training."""
        return mean_in_windows(self.cpu, self.windows)

    @cached_property
    def training_calls(self) -> pd.DataFrame:
        return self.calls[np.isin(self.calls["segment"].to_numpy(), self.training_segments)]

    @cached_property
    def training_getnext_us(self) -> int:
        """The wait of its training GetNexts, in all (the verdict's numerator)."""
        return int(self.training_calls["duration_us"].sum())

    def compact(self) -> "ProcessTraining":
        """The process without its per-batch frames: what combining processes' assessments
        reads (identity, verdict, training windows, the host's CPU series), small enough to
        send from the worker that assessed it."""
        out = dataclasses.replace(self, calls=self.calls.iloc[:0], inits=self.inits.iloc[:0], loaders=[],
                                  fetches=self.fetches.iloc[:0])
        # (cached_property keeps its value in the instance's __dict__: carried over, not recomputed
        # from the emptied frames)
        out.__dict__["training_getnext_us"] = self.training_getnext_us
        out.__dict__["training_cpu_percent"] = self.training_cpu_percent
        return out


# --- intervals ---------------------------------------------------------------------------

def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Overlapping [start, end] intervals merged, sorted."""
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    new = np.ones(len(starts), dtype=bool)
    new[1:] = starts[1:] > reach[:-1]
    firsts = np.flatnonzero(new)
    return starts[firsts], np.maximum.reduceat(ends, firsts)


def in_windows(times: np.ndarray, windows) -> np.ndarray:
    """Which times fall in one of the merged, sorted windows."""
    if not len(windows):
        return np.zeros(len(times), dtype=bool)
    starts = np.fromiter((s for s, _ in windows), dtype=np.int64, count=len(windows))
    ends = np.fromiter((e for _, e in windows), dtype=np.int64, count=len(windows))
    at = np.searchsorted(starts, times, side="right") - 1
    return (at >= 0) & (times <= ends[np.clip(at, 0, None)])


def subtract(w_starts, w_ends, h_starts, h_ends) -> list[tuple[int, int]]:
    """The parts of merged windows outside every hole, as (start, end) pairs."""
    w_starts, w_ends = merge(w_starts, w_ends)
    h_starts, h_ends = merge(h_starts, h_ends)
    if not len(h_starts):
        return list(zip(w_starts.tolist(), w_ends.tolist()))
    # Elementary pieces between all boundaries; keep those inside a window and no hole.
    points = np.unique(np.concatenate([w_starts, w_ends, h_starts, h_ends]))
    lo, hi = points[:-1], points[1:]
    mid = lo + (hi - lo) // 2
    windows = list(zip(w_starts.tolist(), w_ends.tolist()))
    keep = in_windows(mid, windows) & ~_strictly_inside(mid, h_starts, h_ends) & (hi > lo)
    if not keep.any():
        return []
    starts, ends = merge(lo[keep], hi[keep])
    return list(zip(starts.tolist(), ends.tolist()))


def _strictly_inside(times, starts, ends) -> np.ndarray:
    at = np.searchsorted(starts, times, side="right") - 1
    return (at >= 0) & (times < ends[np.clip(at, 0, None)])


# --- steps -------------------------------------------------------------------------------

def _matches(values: pd.Series, pattern: re.Pattern) -> np.ndarray:
    """Rows whose (categorical) value the pattern finds, decided once per category."""
    values = values.astype("category")
    hit = np.array([bool(pattern.search(str(c))) for c in values.cat.categories] + [False])
    return hit[values.cat.codes.to_numpy()]


def _training_steps(framework: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    # Positions, not a copy of the steps' rows (every column of 3M steps: 0.4 s).
    rows = np.flatnonzero((framework["kind"] == fmt.KIND_STEP).to_numpy())
    if len(rows):
        phase, name = framework["phase"].iloc[rows], framework["name"].iloc[rows]
        rows = rows[~(_matches(phase, _EVAL_RE) | _matches(name, _EVAL_RE))]
    start, end = framework["start_us"].to_numpy()[rows], framework["end_us"].to_numpy()[rows]
    # By start, stably; a frame's rows are by start already (frames.framework_frame), so the
    # sort most often moves nothing, and is not made (0.2 s and 72 MB at the assessment's peak
    # at 3M steps).
    return ordered_by(lexsort_or_none(start), start, end)


def _own_steps(calls: pd.DataFrame, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per GetNext, the training step its batch fed (index into starts), or -1.

    That is the step containing the GetNext (Kineto: `ProfilerStep` spans the whole
    iteration), for the first GetNext of the process in it only (a validation loop run
    inside a training step fed none), or else the first step starting before the
    process's next GetNext (smdebug: the step event follows the GetNext).
    """
    if not len(starts) or calls.empty:
        return np.full(len(calls), -1)
    # In place where it can be: this runs at the assessment's peak memory (the calls frame and
    # the steps held), where each array of 3M GetNexts is 24 MB.
    call_start = calls["start_us"].to_numpy()
    before = np.searchsorted(starts, call_start, side="right")
    before -= 1
    containing = ends[np.maximum(before, 0)] > call_start
    containing &= before >= 0
    own = np.searchsorted(starts, call_start, side="left")  # the first step starting at or after the call
    # That step starts before the process's next GetNext: it is one of the steps that do (the
    # steps by start), which is no gather of each call's step (two more arrays here).
    following = own < np.searchsorted(starts, calls["next_start_us"].to_numpy(), side="left")
    own[~following] = -1
    del following
    np.copyto(own, before, where=containing)
    del before
    # (pid, own step) pairs seen before, as one integer key: hashing two columns of a frame took
    # 0.3 s at 3M GetNexts, this 0.1 s. Where the keys of the calls that fed a step never
    # decrease (one pid's calls in time order, the usual case), a key was seen before only if its
    # predecessor among them is the same: a look back, not a hash (0.2 s less). The calls that
    # fed none are not containing ones: whether their key was seen decides nothing.
    # With one pid (the usual case) the key is the step itself: no key array is made. (Each
    # array here is 24 MB at 3M GetNexts, and this runs at the diagnosis's peak.)
    pid = calls["pid"].to_numpy()
    if bool(np.all(pid == pid[0])):  # (the calls are not empty: returned above)
        key = own
    else:
        key = pd.factorize(pid)[0].astype(np.int64, copy=False)
        key *= len(starts) + 1
        key += own
        key += 1
    fed = own >= 0
    fed_keys = key[fed]
    if bool(np.all(fed_keys[1:] >= fed_keys[:-1])):
        repeated = np.zeros(len(fed_keys), dtype=bool)
        repeated[1:] = fed_keys[1:] == fed_keys[:-1]
        later_in_step = np.zeros(len(key), dtype=bool)
        later_in_step[fed] = repeated
    else:
        later_in_step = pd.Series(key).duplicated().to_numpy()
    del key, fed, fed_keys
    own[later_in_step & containing] = -1
    return own


# --- system ------------------------------------------------------------------------------

def _system_series(system: pd.DataFrame, host: str):
    if system.empty:
        empty = pd.Series(dtype="float64")
        return empty, empty, None, 0
    # Categorical columns compared as they are: no string copy of every sample.
    part = system[(system["node"] == host).to_numpy()]
    kinds = part["type"]
    cpu = part[(kinds == "cpu").to_numpy()]
    dims = cpu["dimension"]
    util = cpu[(dims == "CPUUtilization").to_numpy()]
    cores = int(util["name"].nunique()) or None
    cpu_mean = util.groupby("timestamp_us")["value"].mean()
    iowait = cpu[(dims == "I/OWaitPercentage").to_numpy()].groupby("timestamp_us")["value"].mean()
    gpus = int(part.loc[(kinds == "gpu").to_numpy(), "name"].nunique())
    return cpu_mean, iowait, cores, gpus


def mean_in_windows(series: pd.Series, windows) -> float | None:
    if series.empty or not windows:
        return None
    inside = series[in_windows(series.index.to_numpy(), windows)]
    if inside.empty:  # samples sparser than the windows: the nearest ones
        lo, hi = windows[0][0], windows[-1][1]
        times = series.index.to_numpy()
        inside = series[(times >= lo - 1_000_000) & (times <= hi + 1_000_000)]
    return float(inside.mean()) if len(inside) else None


# --- nodes and loaders ---------------------------------------------------------------------

def _calls_frame(framework: pd.DataFrame, found: CallSegments | None = None) -> pd.DataFrame:
    """The GetNext calls in (process, iterator, start) order, with each call's place in its
    iterator, the next call of its process and the main process's compute after it.

    Numpy over integer keys, then one frame: sorting and grouping a frame on its label
    strings took 1.7 s at 3M GetNexts, this 0.8 s (pandas 3 turned the labels into Arrow
    strings and back). The order is the one of a stable sort on the labels (its definition in
    pandas: tests/test_calls_frame.py). `found`: the frame's call_segments, when already
    computed (the panels' batch times read them too)."""
    found = found if found is not None else call_segments(framework)
    process_labels, process_codes = per_category(framework["process"], str, "nan")
    class_labels, class_codes = per_category(framework["name"], iterator_class, "")
    rows, segment_ids, start = found.rows, found.segment, found.start_us
    # The distinct labels, sorted, and where each category's label is among them.
    process_names, process_of_code = np.unique(process_labels, return_inverse=True)
    class_names, class_of_code = np.unique(class_labels, return_inverse=True)
    process_key = process_of_code[process_codes[rows]]
    # call_segments has the calls in (process, pid, start) order (a recorded iterator's together,
    # CallSegments), its iterators numbered in that order: each iterator is one run, its calls
    # by start (frame order among equal ones).
    # So a stable sort on the process's label alone gives (label, iterator, start), where
    # sorting the GetNexts' frame order on all three keys took 0.5 s at 3M GetNexts; the
    # processes are most often in label order already (always, with one), and nothing moves.
    rows, segment_ids, start, process_key = ordered_by(lexsort_or_none(process_key), rows, segment_ids, start,
                                                       process_key)
    pid = ints_or(framework["pid"].iloc[rows], -1)
    end = framework["end_us"].to_numpy(dtype=np.int64)[rows]
    # A segment's calls are consecutive here: a segment is of one process, and each process
    # (category) has one label, so one key.
    starts_segment = np.ones(len(rows), dtype=bool)
    starts_segment[1:] = segment_ids[1:] != segment_ids[:-1]
    run_starts = np.flatnonzero(starts_segment)
    index_in_segment = np.arange(len(rows)) - np.repeat(run_starts, np.diff(np.append(run_starts, len(rows))))
    next_start_in_segment = np.full(len(rows), np.nan)
    next_start_in_segment[:-1] = np.where(starts_segment[1:], np.nan, start[1:])
    # The next GetNext of the same process (any iterator): by (process, pid, start). Mostly the
    # order they are in already (call_segments'), where a sort would cost 0.4 s at 3M GetNexts.
    by_process = lexsort_or_none(start, pid, process_key)
    process_in, pid_in, start_in = ordered_by(by_process, process_key, pid, start)
    same = (process_in[1:] == process_in[:-1]) & (pid_in[1:] == pid_in[:-1])
    del process_in, pid_in
    next_start = np.full(len(rows), _FAR, dtype=np.int64)
    next_start[slice(None, -1) if by_process is None else by_process[:-1]] = np.where(same, start_in[1:], _FAR)

    def column(name: str):
        return take_column(framework[name].array, rows)

    # copy=False: the columns are its own, and copying them into consolidated blocks took 0.6 s
    # at 3M GetNexts.
    return pd.DataFrame({
        # Labels as categoricals: as Python strings, each of these columns was 24 MB at 3M
        # GetNexts, and taking each iterator's class from them 0.17 s of _segment_configs' 0.31 s.
        "process": pd.Categorical.from_codes(process_key, process_names), "pid": pid,
        "cls": pd.Categorical.from_codes(class_of_code.astype(np.int32)[class_codes[rows]], class_names),
        # The waits as the floats the model and the findings compute with (whole numbers of µs,
        # summed exactly): their array, not a copy of it each (24 MB at 3M GetNexts).
        "start_us": start, "end_us": end,
        "duration_us": framework["duration_us"].to_numpy(dtype=np.int64)[rows].astype(np.float64),
        "worker_id": column("worker_id"), "num_workers": column("num_workers"),
        "iterator_id": column("iterator_id"), "segment": segment_ids, "index": index_in_segment,
        "next_start_us": next_start, "compute_us": next_start_in_segment - end},
        copy=False).set_axis(_labels_at(framework.index, rows))


def _labels_at(index: pd.Index, rows: np.ndarray) -> pd.Index:
    """index[rows]: `rows` itself where the labels are the positions (a frame's default index),
    not a copy of it (24 MB at 3M GetNexts, held through the assessment)."""
    if isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1:
        return pd.Index(rows, copy=False, name=index.name)
    return index[rows]


def _inits_frame(framework: pd.DataFrame) -> pd.DataFrame:
    inits = framework[framework["kind"] == fmt.KIND_INIT]
    return pd.DataFrame({
        "process": labels(inits["process"], missing="nan"), "pid": inits["pid"].fillna(-1).astype("int64"),
        "cls": iterator_classes(inits["name"]),
        "start_us": inits["start_us"].astype("int64"), "end_us": inits["end_us"].astype("int64"),
        "duration_us": inits["duration_us"].astype("int64"),
        "num_workers": inits["num_workers"], "pin_memory": inits["pin_memory"],
        "persistent_workers": inits["persistent_workers"], "prefetch_factor": inits["prefetch_factor"],
        "in_order": inits["in_order"], "iterator_id": inits["iterator_id"]},
        index=inits.index).sort_values("start_us", kind="stable")


def _optional(value, kind):
    return None if value is None or pd.isna(value) else kind(value)


def _plausible(values: pd.Series, low: float, high: float) -> pd.Series:
    """The recorded values, missing where outside [low, high] (see MAX_RECORDED_WORKERS)."""
    return values.where(((values >= low) & (values <= high)).fillna(False))


def _segment_configs(calls: pd.DataFrame, inits: pd.DataFrame) -> pd.DataFrame:
    """Per training iterator (segment): its process, class and DataLoader settings, from its
    own initialization where both record an iterator id (this project's collector), else the
    latest initialization of its class on its process before its first GetNext (one
    merge_asof, not a search per iterator), else from what its GetNexts say."""
    firsts = calls.groupby("segment", sort=False).agg(
        pid=("pid", "first"), cls=("cls", "first"), start_us=("start_us", "first"), end_us=("end_us", "max"),
        calls=("start_us", "size"), num_workers_seen=("num_workers", "first"),
        max_worker=("worker_id", "max"), iterator_id=("iterator_id", "first")).reset_index()
    firsts["cls"] = firsts["cls"].astype(object)  # as the initializations' (merged on it below)
    firsts = firsts.sort_values("start_us", kind="stable")
    columns = ["pid", "cls", "start_us", "num_workers", "pin_memory", "persistent_workers",
               "prefetch_factor", "in_order"]
    if len(inits):
        matched = pd.merge_asof(firsts, inits[columns].rename(columns={"start_us": "init_start_us"})
                                .assign(start_us=inits["start_us"].to_numpy()),
                                on="start_us", by=["pid", "cls"], direction="backward")
        # Iterators made side by side (zip(labeled, unlabeled): both made before either's first
        # batch) each take their own: the latest before the first batch was the other's.
        own = inits[inits["iterator_id"].notna()].drop_duplicates(["pid", "cls", "iterator_id"], keep="last")
        if len(own):
            by_id = matched[["pid", "cls", "iterator_id"]].merge(
                own[columns + ["iterator_id"]].rename(columns={"start_us": "init_start_us"}),
                how="left", on=["pid", "cls", "iterator_id"])
            hit = by_id["init_start_us"].notna().to_numpy()
            for column in columns[3:] + ["init_start_us"]:
                matched[column] = matched[column].mask(hit, by_id[column].to_numpy())
    else:
        matched = firsts.assign(**{c: pd.NA for c in columns[3:]}, init_start_us=pd.NA)
    workers = _plausible(matched["num_workers"].astype("Float64"), 0, MAX_RECORDED_WORKERS)
    seen = _plausible(matched["num_workers_seen"].astype("Float64"), 0, MAX_RECORDED_WORKERS)
    matched["prefetch_factor"] = _plausible(matched["prefetch_factor"].astype("Float64"), 1, MAX_RECORDED_PREFETCH)
    ids = matched["max_worker"].astype("Float64")
    # No init: the GetNexts' own count, else at least as many workers as the ids name.
    workers = workers.fillna(seen).fillna(_plausible(ids + 1, 1, MAX_RECORDED_WORKERS))
    # A single-process iterator has none, recorded or not (its init rotated away, or a
    # recording begun after iter()): its loading is the main process's, not "unknown".
    single = matched["cls"].astype(str).str.contains(fmt.SINGLE_PROCESS_ITER, regex=False).to_numpy()
    workers = workers.mask(workers.isna() & single, 0)
    matched["workers"] = workers
    matched["has_init"] = matched["init_start_us"].notna()
    return matched


def _loaders(process: str, calls: pd.DataFrame, inits: pd.DataFrame, training: np.ndarray,
             seen_from_start: frozenset[int]) -> list[Loader]:
    calls = calls[np.isin(calls["segment"].to_numpy(), training)]
    if calls.empty:
        return []
    configs = _segment_configs(calls, inits)
    keys = ["pid", "cls", "workers", "pin_memory", "persistent_workers", "prefetch_factor", "in_order"]
    settings = configs.groupby(keys, dropna=False, sort=False, observed=True).ngroup().to_numpy()
    lane = _lanes(settings, configs["start_us"].to_numpy(np.int64), configs["end_us"].to_numpy(np.int64))
    configs["loader"] = pd.MultiIndex.from_arrays([settings, lane]).factorize()[0]
    lanes_of_settings = pd.Series(lane).groupby(settings).transform("max").to_numpy() + 1
    loader_of = pd.Series(configs["loader"].to_numpy(), index=configs["segment"].to_numpy())
    loader_of_call = loader_of.reindex(calls["segment"].to_numpy()).to_numpy()
    loader_ids = pd.unique(loader_of_call)  # in order of first call, as a group-by without sorting
    out = []
    for loader_id in loader_ids:
        # Most often one loader: all the calls, not a copy of them (a group-by's split sorted and
        # copied the calls frame at the assessment's peak memory, 100 MB at 3M GetNexts).
        group = calls if len(loader_ids) == 1 else calls[loader_of_call == loader_id]
        mine = configs[configs["loader"] == loader_id]
        first = mine.iloc[0]
        workers = _optional(first["workers"], int)
        recorded = _optional(first["persistent_workers"], bool)
        init_count = int(mine["has_init"].sum())
        segments = len(mine)
        persistent = recorded
        if persistent is None and workers and init_count:
            # The reference records __init__ of the iterator, which a persistent loader
            # runs once: fewer initializations than iterators means persistent workers.
            persistent = init_count < segments
        prefetch = _optional(first["prefetch_factor"], int) or TORCH_DEFAULT_PREFETCH
        in_order = _optional(first["in_order"], bool)
        out.append(Loader(
            process=process, pid=int(first["pid"]), cls=str(first["cls"]), num_workers=workers,
            pin_memory=_optional(first["pin_memory"], bool), persistent=persistent,
            persistent_recorded=recorded is not None, prefetch_factor=prefetch,
            in_order=True if in_order is None else in_order,
            calls=group.drop(columns=_FINDING_ONLY),
            seen_from_start=seen_from_start & frozenset(mine["segment"].tolist()),
            init_starts_us=frozenset(int(at) for at in mine["init_start_us"].dropna().tolist()),
            alike=_alike(lane, lanes_of_settings, configs["loader"].to_numpy() == loader_id)))
    out.sort(key=lambda loader: -loader.wait_us)
    return out


def _lanes(settings: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per iterator (by first call), which loader of its settings it is of: iterators that run
    side by side (zip(labeled, unlabeled): each asked in turn) are of different loaders, each
    with its own workers, and an iterator follows the first loader whose last iterator ended
    before it began (an epoch's iterators take their places in the order of their first calls,
    as the last epoch's did). Two alike loaders were one, their batches mixed: the fast one's
    made the slow one's look like slow samples."""
    lane = np.zeros(len(settings), dtype=np.int64)
    order = np.lexsort((starts, settings))
    group, begin, end = settings[order], starts[order], ends[order]
    previous_end = np.r_[np.iinfo(np.int64).min, end[:-1]]
    previous_end[np.r_[True, group[1:] != group[:-1]]] = np.iinfo(np.int64).min  # (a group's first)
    ended_before = pd.Series(previous_end).groupby(group).cummax().to_numpy()
    if not (begin <= ended_before).any():  # (most jobs: one iterator at a time; the loop only where not)
        return lane
    lane_ends: dict[int, list[int]] = {}
    for at, setting, first, last in zip(order.tolist(), group.tolist(), begin.tolist(), end.tolist()):
        ends_of = lane_ends.setdefault(setting, [])
        free = next((i for i, lane_end in enumerate(ends_of) if lane_end < first), len(ends_of))
        if free == len(ends_of):
            ends_of.append(last)
        else:
            ends_of[free] = last
        lane[at] = free
    return lane


def _alike(lane: np.ndarray, lanes: np.ndarray, mine: np.ndarray) -> tuple[int, int] | None:
    """Loader.alike of the loader whose iterators are `mine`."""
    count = int(lanes[mine][0])
    return (int(lane[mine][0]) + 1, count) if count > 1 else None


def _windows(calls: pd.DataFrame, training: np.ndarray, starts, ends, steps_matched: bool,
             epoch_ends: pd.Series):
    """The process's training windows and whether their ends are estimated. `epoch_ends`: by
    (pid, iterator_id), when the next() that ended the epoch began (this project's collector)."""
    seg = calls.groupby("segment", sort=False).agg(
        lo=("start_us", "first"), hi=("end_us", "max"), own_first=("own_step", "first"),
        own_last=("own_step", "max"), compute=("compute_us", "median"), pid=("pid", "first"),
        iterator_id=("iterator_id", "first"))
    in_training = seg.index.isin(training)
    train, evaluation = seg[in_training], seg[~in_training]
    lo = train["lo"].to_numpy(dtype=np.int64)
    hi = train["hi"].to_numpy(dtype=np.int64)
    estimated = False
    if steps_matched:
        first, last = train["own_first"].to_numpy(), train["own_last"].to_numpy()
        lo = np.where(first >= 0, np.minimum(lo, starts[np.clip(first, 0, None)]), lo)
        hi = np.where(last >= 0, np.maximum(hi, ends[np.clip(last, 0, None)]), hi)
        estimated = bool((last < 0).any())
    else:
        # No steps: the epoch ends when the loop asks for a batch after its last step (the
        # collector records that next()); else the last batch's compute is the iterator's
        # median one (an estimate).
        compute = train["compute"].fillna(calls["compute_us"].median()).fillna(0.0)
        guessed = hi + np.maximum(compute.to_numpy(), 0.0).round().astype(np.int64)
        keys = pd.MultiIndex.from_arrays([train["pid"].to_numpy(),
                                          train["iterator_id"].astype("Float64").fillna(-1).astype("int64")])
        recorded = epoch_ends.reindex(keys).to_numpy(dtype=np.float64, na_value=np.nan)
        known = np.isfinite(recorded) & (recorded >= hi)
        guessed = np.minimum(guessed, _next_epoch_end(epoch_ends, train["pid"].to_numpy(), hi))
        hi = np.where(known, np.nan_to_num(recorded).astype(np.int64), guessed)
        estimated = bool((~known).any())
    # An evaluation loop run inside a training step (Kineto: before the next prof.step())
    # is not training time.
    windows = subtract(lo, hi, evaluation["lo"].to_numpy(dtype=np.int64),
                       evaluation["hi"].to_numpy(dtype=np.int64))
    return windows, estimated, pd.DataFrame({"lo": lo, "hi": hi}, index=train.index)


def _next_epoch_end(epoch_ends: pd.Series, pids: np.ndarray, after: np.ndarray) -> np.ndarray:
    """Per iterator (its pid, its last batch's end), when the first epoch-ending next() of its
    pid after that began (_FAR: none). Its last batch's compute ended before it, whichever
    iterator that next() ended: the loop asked for it after. An iterator zipped with another
    records no end of its own (zip stops at the first that ends), and its median compute, the
    other's wait and the step, overshot that end (by 10 ms over two epochs of a zipped job)."""
    bound = np.full(len(pids), _FAR, dtype=np.int64)
    if not len(epoch_ends):
        return bound
    end_pids = epoch_ends.index.get_level_values(0).to_numpy()
    for pid in np.unique(pids).tolist():
        starts = np.append(np.sort(epoch_ends.to_numpy()[end_pids == pid]), _FAR)  # (_FAR: after the last)
        mine = pids == pid
        bound[mine] = starts[np.searchsorted(starts, after[mine], side="left")]
    return bound


def _seen_from_start(calls: pd.DataFrame, framework: pd.DataFrame) -> frozenset[int]:
    """The segments whose first GetNext is the first of its pid after an iterator's
    initialization (the reference's, the collector's) or a `created` event (a Kineto trace's sign
    that the recording saw the iterator begin: trial/kineto_format.py)."""
    kinds = framework["kind"]
    created = framework[((kinds == fmt.KIND_CREATED) | (kinds == fmt.KIND_INIT)).to_numpy()]
    if created.empty or calls.empty:
        return frozenset()
    moment_pid, moment_at = ints_or(created["pid"], -1), created["start_us"].to_numpy(dtype=np.int64)
    pid, start = calls["pid"].to_numpy(), calls["start_us"].to_numpy(dtype=np.int64)
    # A process's calls are in (segment, start) order, its segments one after another: in time
    # order already, but for calls of several pids, or iterators side by side (CallSegments),
    # which are sorted (a sort of 3M calls took 0.3 s).
    order = None if (np.all(pid[1:] == pid[:-1]) and np.all(start[1:] >= start[:-1])) else \
        np.lexsort((start, pid))
    if order is not None:
        pid, start = pid[order], start[order]
    seen = set()
    for one in np.unique(moment_pid).tolist():
        lo, hi = np.searchsorted(pid, one, side="left"), np.searchsorted(pid, one, side="right")
        at = lo + np.searchsorted(start[lo:hi], moment_at[moment_pid == one], side="left")
        at = at[at < hi]  # the first call of its pid at or after each moment
        rows = at if order is None else order[at]
        firsts = rows[calls["index"].to_numpy()[rows] == 0]
        seen.update(calls["segment"].to_numpy()[firsts].tolist())
    return frozenset(int(s) for s in seen)


def _epoch_ends(framework: pd.DataFrame) -> pd.Series:
    """Start of each recorded epoch-ending next(), by (pid, iterator_id)."""
    ends = framework[(framework["kind"] == fmt.KIND_EPOCH_END).to_numpy()]
    ends = ends[ends["iterator_id"].notna()]
    index = pd.MultiIndex.from_arrays([ends["pid"].fillna(-1).astype("int64").to_numpy(),
                                       ends["iterator_id"].astype("int64").to_numpy()])
    series = pd.Series(ends["start_us"].to_numpy(dtype=np.int64), index=index)
    return series[~series.index.duplicated(keep="last")]


def processes(framework: pd.DataFrame, system: pd.DataFrame, processes_per_host: dict[str, int] | None = None,
              found: CallSegments | None = None) -> list[ProcessTraining]:
    """The processes that trained (had GetNexts), by host, rank and pid.

    processes_per_host: how many processes each host of the whole trial has, when `framework`
    holds only some of them (one rank's work): the labels name a rank only on a host of
    several, as they do on the whole trial. `found`: the frame's call_segments, when already
    computed."""
    if not (framework["kind"] == fmt.KIND_GETNEXT).any():
        return []
    calls_all = _calls_frame(framework, found)
    inits_all = _inits_frame(framework)
    identity = {p.id: p for p in processes_of(framework)}
    per_host = Counter(p.node for p in identity.values())
    if processes_per_host is not None:
        per_host.update({host: count - per_host[host] for host, count in processes_per_host.items()
                         if count > per_host[host]})
    # Each process's rows, found in one pass (not one scan of the frame per process); a frame
    # of one process is all its rows (finding them took 0.2 s at 3M GetNexts).
    one_process = len(identity) == 1 and not framework["process"].isna().any()
    rows_of = None if one_process else framework.groupby("process", observed=True, sort=False).indices
    out = []
    # The calls frame is in (process, segment, start) order: each process's calls are one block,
    # taken as a slice (copy-on-write: no copy). Grouping and sorting them again copied it: this
    # step's peak on the 3M-GetNext trial was 1,383 MB with the copies, 1,285 MB without.
    names, codes = calls_all["process"].cat.categories, calls_all["process"].cat.codes.to_numpy()
    bounds = np.r_[0, np.flatnonzero(codes[1:] != codes[:-1]) + 1, len(codes)]
    blocks = deque((names[codes[lo]], calls_all if (lo, hi) == (0, len(codes)) else calls_all.iloc[lo:hi])
                   for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()))
    # (Held by the blocks alone, so that the columns a process no longer reads are let go: its
    # own steps' next starts, 24 MB at 3M GetNexts, where one process has all the calls.)
    del calls_all, codes
    while blocks:
        process, process_calls = blocks.popleft()
        if process not in identity:
            # GetNexts of no process (only a frame made by hand has them: a trial's reader gives
            # every event its file's process): no host or rank to put them on.
            continue
        rows = None if rows_of is None else rows_of[process]
        process_fw = framework if rows is None or len(rows) == len(framework) else framework.iloc[rows]  # no copy
        starts, ends = _training_steps(process_fw)
        own = _own_steps(process_calls, starts, ends)
        process_calls = process_calls.drop(columns=_OWN_STEPS_ONLY).assign(own_step=own, training=own >= 0)
        del own  # (the frame holds its own copy: 24 MB at 3M GetNexts, through the loaders' finding)
        share = process_calls.groupby("segment", sort=False)["training"].mean()
        has_steps = len(starts) > 0
        training = share.index.to_numpy()[share.to_numpy() >= 0.5] if has_steps else np.array([], dtype=np.int64)
        steps_matched = bool(len(training))
        if not steps_matched:
            training = share.index.to_numpy()
        windows, estimated, segment_windows = _windows(process_calls, training, starts, ends, steps_matched,
                                                       _epoch_ends(process_fw))
        inits = inits_all[(inits_all["process"] == process).to_numpy()]
        host, rank = identity[process].node, identity[process].rank
        pid = int(process_calls["pid"].iloc[0])
        label = host if per_host[host] <= 1 else f"{host} {'rank %d' % rank if rank is not None else 'pid %d' % pid}"
        cpu, iowait, cores, gpus = _system_series(system, host)
        span = int(process_fw["end_us"].max() - process_fw["start_us"].min())
        fetches = process_fw[(process_fw["kind"] == fmt.KIND_FETCH).to_numpy()][
            ["start_us", "end_us", "duration_us", "worker_id", "iterator_id", "cpu_us", "runq_us"]]
        trained = _loaders(process, process_calls, inits, training, _seen_from_start(process_calls, process_fw))
        out.append(ProcessTraining(process, host, rank, pid, label, span, process_calls.drop(columns=_FINDING_ONLY),
                                   inits, training, windows,
                           has_steps, steps_matched, estimated, segment_windows, trained, cpu, iowait, cores, gpus,
                           fetches))
    out.sort(key=process_order)
    return out


def process_order(process: ProcessTraining) -> tuple:
    return identity_order(process.host, process.rank, process.pid, process.id)
