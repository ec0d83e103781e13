"""Is the job input-bound, and what to change: pure functions from the canonical frames.

Verdict: the share of training time the main process spends waiting in GetNext. Training
time is, per training iterator, the time from its first GetNext to its last, widened to
the training steps that the first and last batches fed where step events are present;
the windows of a node's iterators are merged so that overlapping ones count once, and
the spans of evaluation iterators inside them are taken out. An iterator is a training
one when most of its batches feed training steps (smdebug's `Step:ModeKeys.TRAIN`, after
the GetNext; Kineto's `ProfilerStep#N`, around it, first GetNext of the step only);
without step events every iterator counts. The classes are those of TensorFlow's
input-pipeline analyzer: >= 20 % highly, >= 5 % moderately, else not input-bound.

Recommendations: each names its evidence (numbers, worker ids, batches and windows), the
DataLoader argument to change and, where a model allows, the time it would save. Every
threshold is a named constant below with the reason for its value. A finding whose saving
is a small share of the job is not reported: a clean job gets none.

No I/O, no printing. Times are epoch microseconds in frames; seconds in results.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd

from .. import format as fmt
from ..trial.load import host_of
from .dataloader import DEFAULT_OUTLIER_FACTOR, iterator_classes, iterator_segments, labels

# --- thresholds -----------------------------------------------------------------------

# TensorFlow profiler's input-pipeline analyzer (the best-known one) uses these bounds
# on the share of step time spent waiting for input.
HIGHLY_INPUT_BOUND_PERCENT = 20.0
MODERATELY_INPUT_BOUND_PERCENT = 5.0
CLASS_HIGHLY, CLASS_MODERATELY, CLASS_NOT = "highly", "moderately", "not"

# A finding must be worth the change: its saving (or the time at stake) must reach this
# share of the node's profiled time (first to last event). Below it a job is clean.
MIN_SHARE_OF_JOB = 0.02
# Mean system CPU utilisation (over all cores, during training) at which the host counts as
# saturated: above it, extra workers only compete with the ones there (and with the main
# process) for the same cores. Schedulers and monitoring rarely let a busy host read higher.
CPU_SATURATED_PERCENT = 90.0
# Mean I/O wait (over all cores) during GetNext stalls that marks the stalls as storage's:
# a training host otherwise reads near 0 %, and with several cores a tenth of all of them
# idle on storage means the workers are blocked on reads.
IOWAIT_HIGH_PERCENT = 10.0
# A first batch this many times slower than the steady median is a start-up cost...
STARTUP_FACTOR = 5.0
# ...worth a finding when the first batches together cost this share of the job: starting
# workers always costs something (tens of ms to fork, seconds to spawn), and under 5 %
# that is the normal price of having workers.
STARTUP_MIN_SHARE = 0.05
# A worker whose median fetch time (worker-side, recorded by this project's collector) is
# this many times the other workers' is slow.
SLOW_WORKER_FACTOR = 2.0
# Without worker-side times, the main process's waits on each worker's batches are all
# there is, and they are uneven even when the workers are not: under balanced load the wait
# lands on whichever batch is due first in a round (a real CPU-saturated 2-worker job read
# 2.2x between its workers). So a median wait this many times the others' is required.
SLOW_WORKER_WAIT_FACTOR = 4.0
# Outliers concentrated on one worker: chance of that many (or more) landing on one of W
# workers, if outliers fell on workers at random, below this p-value (Bonferroni over W).
SLOW_WORKER_P_VALUE = 0.01
# Head-of-line stalls without worker ids: at least this many stalls, most gaps between
# consecutive stalls equal to one period, and the stalls covering most of their batches.
PERIOD_MIN_STALLS = 4
PERIOD_GAP_SHARE = 0.75
PERIOD_COVERAGE = 0.5
PERIOD_MAX = 64
# Worker-count advice needs the job input-bound without the first and last GetNext of each
# iterator (start-up, shutdown), by MODERATELY_INPUT_BOUND_PERCENT; and it is left out
# when a slow worker or storage stalls explain at least this share of the wait (those are
# the fix; more workers would only dilute them).
EXPLAINED_SHARE = 0.5
# With no core count known, never suggest more workers than this at once.
MAX_SUGGESTED_WORKERS = 16
# Batches needed per loader for a median to mean anything.
MIN_BATCHES = 3
# Evidence lists are capped; counts say how many there were.
MAX_LISTED = 20

_EVAL_RE = re.compile(r"EVAL|PREDICT", re.IGNORECASE)


# --- results ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    input_percent: float | None  # None: no GetNext to judge by
    class_: str | None  # highly | moderately | not, None with input_percent
    basis: str
    getnext_s: float = 0.0
    training_s: float = 0.0


@dataclass(frozen=True)
class Recommendation:
    id: str
    text: str
    evidence: dict
    saving_s: float | None = None


@dataclass
class Assessment:
    verdict: Verdict
    nodes_verdict: dict[str, Verdict]
    recommendations: list[Recommendation]


def classify_input_percent(percent: float | None) -> str | None:
    if percent is None:
        return None
    if percent >= HIGHLY_INPUT_BOUND_PERCENT:
        return CLASS_HIGHLY
    if percent >= MODERATELY_INPUT_BOUND_PERCENT:
        return CLASS_MODERATELY
    return CLASS_NOT


# --- the model of a node: its GetNexts, iterators, training windows, system ---------------

@dataclass
class _Loader:
    """The training iterators of one DataLoader configuration on one process."""
    pid: int
    cls: str
    num_workers: int | None
    pin_memory: bool | None
    calls: pd.DataFrame  # its GetNexts: start_us, end_us, duration_us, worker_id, segment, index
    segments: int

    @cached_property
    def steady(self) -> pd.DataFrame:
        """GetNexts after the first of each iterator (the first pays start-up)."""
        return self.calls[self.calls["index"] > 0]

    @cached_property
    def steady_median_us(self) -> float | None:
        steady = self.steady["duration_us"]
        return float(steady.median()) if len(steady) >= MIN_BATCHES else None

    @property
    def name(self) -> str:
        """The iterator class, without Kineto's 'enumerate(DataLoader)#' prefix."""
        return self.cls.split("#", 1)[1] if self.cls.startswith("enumerate(") else self.cls

    @property
    def multi_process(self) -> bool:
        return bool(self.num_workers) or (self.num_workers is None and "SingleProcess" not in self.cls)


@dataclass
class _Node:
    node: str
    span_us: int  # first to last framework event
    calls: pd.DataFrame  # every GetNext, with segment, index, training
    inits: pd.DataFrame
    training_segments: list[int]
    windows: list[tuple[int, int]]  # merged training windows
    has_steps: bool
    steps_matched: bool
    loaders: list[_Loader]
    cpu: pd.Series  # mean CPUUtilization over cores, by timestamp_us
    iowait: pd.Series
    cores: int | None
    gpus: int
    fetches: pd.DataFrame  # worker-side fetch events (collector), else empty
    verdict: Verdict = field(default=None)

    @property
    def training_us(self) -> int:
        return sum(e - s for s, e in self.windows)

    @property
    def training_calls(self) -> pd.DataFrame:
        return self.calls[self.calls["segment"].isin(self.training_segments)]


def _merge(intervals) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _subtract(windows: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of merged `windows` outside every merged hole."""
    out = []
    for start, end in windows:
        for hole_start, hole_end in holes:
            if hole_end <= start or hole_start >= end:
                continue
            if hole_start > start:
                out.append((start, hole_start))
            start = max(start, hole_end)
            if start >= end:
                break
        if start < end:
            out.append((start, end))
    return out


def _in_windows(times: np.ndarray, windows: list[tuple[int, int]]) -> np.ndarray:
    if not windows:
        return np.zeros(len(times), dtype=bool)
    starts = np.array([s for s, _ in windows])
    ends = np.array([e for _, e in windows])
    at = np.searchsorted(starts, times, side="right") - 1
    return (at >= 0) & (times <= ends[np.clip(at, 0, None)])


def _training_steps(framework: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    steps = framework[framework["kind"] == fmt.KIND_STEP]
    if len(steps):
        steps = steps[~(_matches(steps["phase"], _EVAL_RE) | _matches(steps["name"], _EVAL_RE))]
    order = np.argsort(steps["start_us"].to_numpy(), kind="stable")
    return steps["start_us"].to_numpy()[order], steps["end_us"].to_numpy()[order]


def _matches(values: pd.Series, pattern: re.Pattern) -> np.ndarray:
    """Rows whose (categorical) value the pattern finds, decided once per category."""
    values = values.astype("category")
    hit = np.array([bool(pattern.search(str(c))) for c in values.cat.categories] + [False])
    return hit[values.cat.codes.to_numpy()]


def _own_steps(calls: pd.DataFrame, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per GetNext, the training step its batch fed (index into starts), or -1.

    That is the step containing the GetNext (Kineto: `ProfilerStep` spans the whole
    iteration), for the first GetNext of the process in it only (a validation loop run
    inside a training step fed none), or else the first step starting before the
    process's next GetNext (smdebug: the step event follows the GetNext).
    """
    if not len(starts) or calls.empty:
        return np.full(len(calls), -1)
    call_start = calls["start_us"].to_numpy()
    next_start = calls["next_start_us"].to_numpy()
    before = np.searchsorted(starts, call_start, side="right") - 1
    containing = (before >= 0) & (ends[np.clip(before, 0, None)] > call_start)
    after = np.searchsorted(starts, call_start, side="left")
    following = (after < len(starts)) & (starts[np.clip(after, None, len(starts) - 1)] < next_start)
    own = np.where(containing, before, np.where(following, after, -1))
    later_in_step = pd.DataFrame({"pid": calls["pid"].to_numpy(), "own": own}).duplicated().to_numpy()
    return np.where(later_in_step & containing, -1, own)


def _system_series(system: pd.DataFrame, host: str, node: str):
    if system.empty:
        empty = pd.Series(dtype="float64")
        return empty, empty, None, 0
    # Categorical columns compared as they are: no string copy of every sample.
    part = system[((system["node"] == host) | (system["node"] == node)).to_numpy()]
    kinds = part["type"]
    cpu = part[(kinds == "cpu").to_numpy()]
    dims = cpu["dimension"]
    util = cpu[(dims == "CPUUtilization").to_numpy()]
    cores = int(util["name"].nunique()) or None
    cpu_mean = util.groupby("timestamp_us")["value"].mean()
    iowait = cpu[(dims == "I/OWaitPercentage").to_numpy()].groupby("timestamp_us")["value"].mean()
    gpus = int(part.loc[(kinds == "gpu").to_numpy(), "name"].nunique())
    return cpu_mean, iowait, cores, gpus


def _int_or_none(value):
    return None if value is None or pd.isna(value) else int(value)


def _bool_or_none(value):
    return None if value is None or pd.isna(value) else bool(value)


def _loaders(node_calls: pd.DataFrame, inits: pd.DataFrame, segments: list[int]) -> list[_Loader]:
    """Training iterators grouped by their DataLoader configuration (from the latest
    initialization before each, else from what the GetNexts say)."""
    calls = node_calls[node_calls["segment"].isin(segments)]
    rows = []
    for segment, group in calls.groupby("segment", sort=False):
        first = group.iloc[0]
        cls, pid = first["cls"], first["pid"]
        mine = inits[(inits["cls"] == cls) & (inits["pid"] == pid) & (inits["start_us"] <= first["start_us"])]
        if len(mine):
            init = mine.iloc[-1]
            workers, pin = _int_or_none(init["num_workers"]), _bool_or_none(init["pin_memory"])
        else:
            known = group["num_workers"].dropna()
            workers = int(known.iloc[0]) if len(known) else None
            ids = group["worker_id"].dropna()
            if workers is None and len(ids) and ids.max() >= 0:
                workers = int(ids.max()) + 1  # at least this many
            pin = None
        rows.append((pid, cls, workers, pin, segment))
    loaders = []
    keys = {}
    for pid, cls, workers, pin, segment in rows:
        keys.setdefault((pid, cls, workers, pin), []).append(segment)
    for (pid, cls, workers, pin), segs in keys.items():
        loaders.append(_Loader(pid, cls, workers, pin, calls[calls["segment"].isin(segs)], len(segs)))
    loaders.sort(key=lambda loader: -int(loader.calls["duration_us"].sum()))
    return loaders


def _nodes(framework: pd.DataFrame, system: pd.DataFrame) -> list[_Node]:
    getnext_mask = framework["kind"] == fmt.KIND_GETNEXT
    if not getnext_mask.any():
        return []
    segment = iterator_segments(framework)
    calls = framework[getnext_mask]
    calls = pd.DataFrame({
        "node": labels(calls["node"], missing="nan"), "pid": calls["pid"].fillna(-1).astype("int64"),
        "cls": iterator_classes(calls["name"]),
        "start_us": calls["start_us"].astype("int64"), "end_us": calls["end_us"].astype("int64"),
        "duration_us": calls["duration_us"].astype("int64"), "worker_id": calls["worker_id"],
        "num_workers": calls["num_workers"], "iterator_id": calls["iterator_id"], "segment": segment},
        index=calls.index)
    calls = calls.sort_values(["node", "start_us"], kind="stable")
    calls["index"] = calls.groupby("segment", sort=False).cumcount()
    calls["next_start_us"] = (calls.groupby(["node", "pid"], sort=False)["start_us"].shift(-1)
                              .fillna(2**62).astype("int64"))  # the last: no next GetNext
    inits_all = framework[framework["kind"] == fmt.KIND_INIT]
    inits_all = pd.DataFrame({
        "node": labels(inits_all["node"], missing="nan"), "pid": inits_all["pid"].fillna(-1).astype("int64"),
        "cls": iterator_classes(inits_all["name"]),
        "start_us": inits_all["start_us"].astype("int64"), "end_us": inits_all["end_us"].astype("int64"),
        "duration_us": inits_all["duration_us"].astype("int64"),
        "num_workers": inits_all["num_workers"], "pin_memory": inits_all["pin_memory"]}
    ).sort_values("start_us", kind="stable")

    out = []
    for node, node_calls in calls.groupby("node", sort=True):
        on_node = (framework["node"] == node).to_numpy()
        node_fw = framework if on_node.all() else framework[on_node]  # one node: no copy
        starts, ends = _training_steps(node_fw)
        own = _own_steps(node_calls, starts, ends)
        node_calls = node_calls.assign(own_step=own, training=own >= 0)
        seg_stats = node_calls.groupby("segment", sort=False).agg(
            share=("training", "mean"), lo=("start_us", "first"), hi=("end_us", "max"),
            first_step=("own_step", "first"), last_step=("own_step", "last"))
        has_steps = len(starts) > 0
        training = list(seg_stats.index[seg_stats["share"] >= 0.5]) if has_steps else []
        steps_matched = bool(training)
        if not training:
            training = list(seg_stats.index)
        windows = []
        for seg in seg_stats.loc[training].itertuples():
            lo, hi = int(seg.lo), int(seg.hi)
            # widened to the steps the first and last batches fed
            if steps_matched and seg.first_step >= 0:
                lo = min(lo, int(starts[seg.first_step]))
            if steps_matched and seg.last_step >= 0:
                hi = max(hi, int(ends[seg.last_step]))
            windows.append((lo, hi))
        # An evaluation loop run inside a training step (Kineto: before the next prof.step())
        # is not training time.
        evaluation = seg_stats.drop(index=training)
        windows = _subtract(_merge(windows), _merge(zip(evaluation["lo"], evaluation["hi"])))
        inits = inits_all[inits_all["node"] == node]
        cpu, iowait, cores, gpus = _system_series(system, host_of(node), node)
        span = int(node_fw["end_us"].max() - node_fw["start_us"].min())
        fetches = node_fw[node_fw["kind"] == fmt.KIND_FETCH][
            ["start_us", "end_us", "duration_us", "worker_id", "iterator_id"]]
        item = _Node(node, span, node_calls, inits, training, windows, has_steps, steps_matched,
                     _loaders(node_calls, inits, training), cpu, iowait, cores, gpus, fetches)
        item.verdict = _node_verdict(item)
        out.append(item)
    return out


# --- the verdict ------------------------------------------------------------------------

def _basis(nodes: list[_Node]) -> str:
    iterators = sum(len(n.training_segments) for n in nodes)
    how = ("from the first to the last GetNext of each of {it} training iterator(s)"
           .format(it=iterators))
    if all(n.steps_matched for n in nodes):
        how += ", told from evaluation ones by the training steps they fed"
    elif any(n.has_steps and not n.steps_matched for n in nodes):
        how += "; no iterator fed the training steps, so every iterator counts"
    else:
        how += "; no step events, so every iterator counts as training"
    where = f" on {len(nodes)} nodes" if len(nodes) > 1 else ""
    return how + where


def _make_verdict(getnext_us: int, training_us: int, basis: str) -> Verdict:
    if training_us <= 0:
        return Verdict(None, None, "no GetNext time to judge by" if not getnext_us else basis)
    percent = 100.0 * min(getnext_us, training_us) / training_us
    getnext_s, training_s = getnext_us / 1e6, training_us / 1e6
    return Verdict(round(percent, 2), classify_input_percent(percent),
                   f"GetNext {getnext_s:.3f} s of {training_s:.3f} s of training, {basis}",
                   getnext_s, training_s)


def _node_verdict(node: _Node) -> Verdict:
    getnext = int(node.training_calls["duration_us"].sum())
    return _make_verdict(getnext, node.training_us, _basis([node]))


def _trial_verdict(nodes: list[_Node]) -> Verdict:
    if not nodes:
        return Verdict(None, None, "no GetNext events: nothing to judge by")
    getnext = sum(int(n.training_calls["duration_us"].sum()) for n in nodes)
    return _make_verdict(getnext, sum(n.training_us for n in nodes), _basis(nodes))


# --- findings ----------------------------------------------------------------------------

def _s(us: float) -> str:
    """A duration for text: '1.23 s' or '45.6 ms'."""
    return f"{us / 1e6:.2f} s" if abs(us) >= 1e6 else f"{us / 1e3:.1f} ms"


def _worth(node: _Node, us: float, share: float = MIN_SHARE_OF_JOB) -> bool:
    return node.span_us > 0 and us >= share * node.span_us


def _loader_name(loader: _Loader) -> str:
    workers = "num_workers unknown" if loader.num_workers is None else f"num_workers={loader.num_workers}"
    return f"{loader.name} ({workers})"


def _batch_list(calls: pd.DataFrame, segment_number: dict) -> list[dict]:
    return [{"iterator": segment_number[row.segment], "batch": int(row.index_), "start_us": int(row.start_us),
             "duration_s": round(row.duration_us / 1e6, 6)}
            for row in calls.rename(columns={"index": "index_"}).head(MAX_LISTED).itertuples()]


def _segment_numbers(loader: _Loader) -> dict:
    """Iterators of a loader numbered 1.. in time order, for naming batches."""
    order = loader.calls.groupby("segment", sort=False)["start_us"].min().sort_values()
    return {seg: n for n, seg in enumerate(order.index, 1)}


def _persistent_workers(node: _Node) -> list[Recommendation]:
    """Several initializations of one multi-process loader, each paying start-up."""
    found = []
    inits = node.inits
    if inits.empty:
        return found
    calls = node.calls
    for (pid, cls, workers, pin), group in inits.groupby(
            ["pid", "cls", inits["num_workers"].fillna(-1), inits["pin_memory"].astype("object").fillna("?")],
            sort=False):
        if workers is None or workers <= 0 or len(group) < 2:
            continue
        mine = calls.loc[(calls["pid"] == pid) & (calls["cls"] == cls),
                         ["start_us", "end_us", "duration_us", "index"]]
        steady = mine.loc[mine["index"] > 0, "duration_us"]
        baseline = float(steady.median()) if len(steady) >= MIN_BATCHES else 0.0
        group = group.sort_values("start_us")
        next_init = list(group["start_us"].iloc[1:]) + [2**62]
        starts = []
        for (_, init), until in zip(group.iterrows(), next_init):
            firsts = mine[(mine["start_us"] >= init["end_us"]) & (mine["start_us"] < until)]
            first_us = float(firsts["duration_us"].iloc[0]) if len(firsts) else None
            extra = max(0.0, first_us - baseline) if first_us is not None else 0.0
            # A start runs from its initialization to the end of its first batch (or of the
            # initialization, when no batch followed).
            end_us = int(firsts["end_us"].iloc[0]) if len(firsts) else int(init["end_us"])
            starts.append({"start_us": int(init["start_us"]), "end_us": end_us,
                           "init_s": init["duration_us"] / 1e6,
                           "first_batch_s": None if first_us is None else first_us / 1e6,
                           "startup_s": (init["duration_us"] + extra) / 1e6})
        startup_us = float(np.median([s["startup_s"] for s in starts])) * 1e6
        count = len(starts)
        saving_us = (count - 1) * startup_us
        if not _worth(node, saving_us):
            continue
        init_us = float(group["duration_us"].median())
        name = cls.split("#", 1)[1] if cls.startswith("enumerate(") else cls
        text = (f"Workers are re-created every epoch: {name} with num_workers={int(workers)} was initialized "
                f"{count} times on {node.node}, each start costing about {_s(startup_us)} "
                f"(initialization {_s(init_us)}, and the first batch's wait beyond the median GetNext of "
                f"{_s(baseline)}). Set `persistent_workers=True` on this DataLoader so its workers start "
                f"once: saves about ({count} - 1) x {_s(startup_us)} = {_s(saving_us)}.")
        found.append(Recommendation("persistent_workers", text, {
            "node": node.node, "loader": cls, "num_workers": int(workers),
            "pin_memory": None if pin == "?" else bool(pin), "initializations": count,
            "startup_s": round(startup_us / 1e6, 6), "init_median_s": round(init_us / 1e6, 6),
            "median_getnext_s": round(baseline / 1e6, 6), "starts": starts[:MAX_LISTED]},
            round(saving_us / 1e6, 3)))
    return found


def _startup(node: _Node) -> list[Recommendation]:
    """A first batch much slower than the steady median."""
    found = []
    for loader in node.loaders:
        baseline = loader.steady_median_us
        if baseline is None:
            continue
        firsts = loader.calls[loader.calls["index"] == 0]
        first_us = float(firsts["duration_us"].median())
        excess_us = float((firsts["duration_us"] - baseline).clip(lower=0).sum())
        if first_us < STARTUP_FACTOR * max(baseline, 1.0) or not _worth(node, excess_us, STARTUP_MIN_SHARE):
            continue
        ratio = first_us / max(baseline, 1.0)
        text = (f"The first batch of {_loader_name(loader)} on {node.node} takes {_s(first_us)}, "
                f"{ratio:.0f}x the median GetNext ({_s(baseline)}): a start-up cost, paid "
                f"{len(firsts)} time(s), {_s(excess_us)} in all. Workers started with 'spawn' (the "
                f"default on macOS and Windows, and needed with CUDA in the parent) re-import the main "
                f"module and unpickle the dataset: use `multiprocessing_context='forkserver'` or 'fork' "
                f"where safe, keep the Dataset's `__init__` and `worker_init_fn` light (open files and "
                f"connections lazily, in the worker), and keep the dataset object small to pickle.")
        found.append(Recommendation("startup", text, {
            "node": node.node, "loader": loader.name, "num_workers": loader.num_workers,
            "first_batch_s": round(first_us / 1e6, 6), "median_getnext_s": round(baseline / 1e6, 6),
            "ratio": round(ratio, 1), "iterators": len(firsts), "excess_s": round(excess_us / 1e6, 6),
            "first_batches": [{"start_us": int(r.start_us), "duration_s": round(r.duration_us / 1e6, 6)}
                              for r in firsts.head(MAX_LISTED).itertuples()]}, None))
    return found


def _mean_in_windows(series: pd.Series, windows) -> float | None:
    if series.empty:
        return None
    inside = series[_in_windows(series.index.to_numpy(), windows)]
    if inside.empty:  # samples sparser than the windows: the nearest ones
        lo, hi = windows[0][0], windows[-1][1]
        times = series.index.to_numpy()
        inside = series[(times >= lo - 1_000_000) & (times <= hi + 1_000_000)]
    return float(inside.mean()) if len(inside) else None


def _workers(node: _Node) -> list[Recommendation]:
    """Input-bound: more workers, unless the CPUs are saturated; workers at all for num_workers=0."""
    verdict = node.verdict
    if verdict.class_ not in (CLASS_HIGHLY, CLASS_MODERATELY) or not node.loaders:
        return []
    loader = node.loaders[0]  # the training loader waited on most
    calls = node.training_calls
    batches = len(calls)
    baseline = loader.steady_median_us
    training_us = node.training_us
    if baseline is None or not batches or training_us <= 0:
        return []
    # Without each iterator's first GetNext (start-up) and last (with Kineto the StopIteration
    # call, which shuts the workers down): more workers cut neither.
    last = calls.groupby("segment", sort=False)["index"].transform("max")
    steady_us = float(calls.loc[(calls["index"] > 0) & (calls["index"] < last), "duration_us"].sum())
    steady_percent = 100.0 * steady_us / training_us
    if steady_percent < MODERATELY_INPUT_BOUND_PERCENT:
        return []  # the wait is the start-up's, which its own findings explain
    batch_us = training_us / batches
    wait_us = float(calls["duration_us"].sum()) / batches
    compute_us = max(batch_us - wait_us, 0.0)
    # Workers deliver one batch per (load time / W); input-bound, that is the batch time now.
    # So W workers need load time / compute time = W x batch / compute to keep up.
    cpu = _mean_in_windows(node.cpu, node.windows)
    cores = node.cores
    evidence = {"node": node.node, "loader": loader.name, "num_workers": loader.num_workers,
                "input_percent": verdict.input_percent, "steady_input_percent": round(steady_percent, 2),
                "batches": batches, "median_getnext_s": round(baseline / 1e6, 6),
                "batch_s": round(batch_us / 1e6, 6), "compute_s": round(compute_us / 1e6, 6),
                "cpu_percent": None if cpu is None else round(cpu, 1), "cores": cores}

    def saving(current: float, suggested: int) -> float:
        """Batch time W/W' of now (never under the compute time), over all batches."""
        if current == 0:  # single process: load time is the wait, spread over W' workers
            new_batch = max(compute_us, wait_us / suggested)
        else:
            new_batch = max(compute_us, batch_us * current / suggested)
        return min(max(0.0, (batch_us - new_batch) * batches), wait_us * batches)  # never over the wait

    cap = max(1, cores - 1) if cores else MAX_SUGGESTED_WORKERS  # one core for the main process
    if loader.num_workers == 0:
        needed = wait_us / compute_us if compute_us > 0 else math.inf
        suggested = int(min(cap, max(2, math.ceil(needed))))
        saved = saving(0, suggested)
        text = (f"The training loader {loader.name} runs in the main process (num_workers=0) and the job is "
                f"{verdict.class_} input-bound ({verdict.input_percent:.1f} % of training waits in GetNext, "
                f"median {_s(baseline)} per batch against {_s(compute_us)} of compute). Load in worker "
                f"processes: `num_workers={suggested}`"
                + (f" ({cores} cores" + (f", {cpu:.0f} % busy)" if cpu is not None else ")") if cores else "")
                + f"; saves about {_s(saved)}.")
        return [Recommendation("use_workers", text, {**evidence, "suggested_num_workers": suggested},
                               round(saved / 1e6, 3))]

    workers = loader.num_workers
    if cpu is not None and cores:
        free_cores = cores * (1.0 - cpu / 100.0)
        if cpu >= CPU_SATURATED_PERCENT or free_cores < 1.0:
            text = (f"The job is {verdict.class_} input-bound ({verdict.input_percent:.1f} % of training "
                    f"waits in GetNext) and the CPUs are saturated ({cpu:.0f} % mean over {cores} cores "
                    f"during training, {free_cores:.1f} core(s) free): more workers will not help. Make "
                    f"per-sample work cheaper (decode "
                    f"smaller images, lighter augmentation, a faster decoder), cache decoded or "
                    f"preprocessed samples, or move decoding and augmentation to the GPU (e.g. NVIDIA "
                    f"DALI, `torchvision.io.decode_jpeg(device='cuda')`).")
            return [Recommendation("cpu_saturated", text, {**evidence, "cpu_saturated_percent":
                                                           CPU_SATURATED_PERCENT}, None)]
        if workers is not None and workers >= cap:
            return []  # as many workers as cores already: storage or per-sample cost, not count
    if cpu is not None and cores and workers is not None:
        needed = workers * batch_us / compute_us if compute_us > 0 else math.inf
        suggested = int(min(cap, workers + math.floor(free_cores), max(workers + 1, math.ceil(needed))))
        if suggested <= workers:
            return []
        saved = saving(workers, suggested)
        text = (f"The job is {verdict.class_} input-bound ({verdict.input_percent:.1f} % of training waits "
                f"in GetNext, median {_s(baseline)} per batch) with CPU headroom ({cpu:.0f} % mean over "
                f"{cores} cores): raise `num_workers` from {workers} to {suggested} on {loader.name}; "
                f"saves about {_s(saved)}.")
        return [Recommendation("more_workers", text, {**evidence, "suggested_num_workers": suggested},
                               round(saved / 1e6, 3))]

    # No CPU metrics (Kineto traces, or no system/ folder) or no worker count: with a caveat.
    factor = batch_us / compute_us if compute_us > 0 else math.inf
    suggested = (int(min(MAX_SUGGESTED_WORKERS, max(workers + 1, math.ceil(workers * factor))))
                 if workers else None)
    saved = saving(workers, suggested) if workers else wait_us * batches  # all of the wait, at most
    howmany = (f"raise `num_workers` from {workers} to about {suggested}" if workers else
               f"raise `num_workers` to about {min(factor, MAX_SUGGESTED_WORKERS):.1f}x its current value "
               f"(the trace does not record it)")
    headroom = (f"CPU use was not recorded: if the CPUs have headroom, {howmany} on {loader.name}; if "
                f"they are saturated, more workers will not help: make per-sample work cheaper, cache, or "
                f"decode on the GPU." if cpu is None else
                f"The CPUs have headroom ({cpu:.0f} % mean over {cores} cores): {howmany} on {loader.name}.")
    text = (f"The job is {verdict.class_} input-bound ({verdict.input_percent:.1f} % of training waits in "
            f"GetNext, median {_s(baseline)} per batch against {_s(compute_us)} of compute). {headroom} "
            + ("Saves about " if workers else "Saves up to ") + f"{_s(saved)}.")
    return [Recommendation("more_workers", text, {**evidence, "suggested_num_workers": suggested,
                                                  "suggested_factor": None if not math.isfinite(factor)
                                                  else round(factor, 2)},
                           round(saved / 1e6, 3))]


def _storage(node: _Node, factor: float) -> list[Recommendation]:
    """High I/O wait during the GetNext stalls."""
    if node.iowait.empty:
        return []
    stalls, excess_us = [], 0.0
    for loader in node.loaders:
        baseline = loader.steady_median_us
        if baseline is None:
            continue
        steady = loader.steady
        slow = steady[steady["duration_us"] > factor * max(baseline, 1.0)]
        stalls.append(slow)
        excess_us += float((slow["duration_us"] - baseline).sum())
    stalls = pd.concat(stalls) if stalls else pd.DataFrame()
    if stalls.empty or not _worth(node, excess_us):
        return []
    times = node.iowait.index.to_numpy()
    interval = float(np.median(np.diff(times))) if len(times) > 1 else 1_000_000.0
    half = interval / 2
    windows = _merge((int(s - half), int(e + half)) for s, e in zip(stalls["start_us"], stalls["end_us"]))
    during = _in_windows(times, windows)
    if not during.any():
        return []
    iowait = float(node.iowait[during].mean())
    if iowait < IOWAIT_HIGH_PERCENT:
        return []
    training = _in_windows(times, node.windows) & ~during
    elsewhere = float(node.iowait[training].mean()) if training.any() else None
    stalls = stalls.sort_values("duration_us", ascending=False)
    text = (f"Storage-bound: during the {len(stalls)} GetNext stalls on {node.node} (over {factor:g}x the "
            f"median) the CPUs wait on I/O {iowait:.0f} % of the time"
            + (f" (against {elsewhere:.0f} % otherwise in training)" if elsewhere is not None else "")
            + f"; the stalls cost {_s(excess_us)}. Read faster: copy the data to local disk or NVMe (or a "
            f"faster file system), read larger sequential shards (WebDataset, TFRecord-like formats), "
            f"cache hot data in memory; I/O-bound loading also tolerates more workers than cores.")
    return [Recommendation("storage_bound", text, {
        "node": node.node, "stalls": len(stalls), "iowait_percent": round(iowait, 1),
        "iowait_elsewhere_percent": None if elsewhere is None else round(elsewhere, 1),
        "iowait_threshold_percent": IOWAIT_HIGH_PERCENT, "excess_s": round(excess_us / 1e6, 6),
        "windows": [{"start_us": int(r.start_us), "end_us": int(r.end_us),
                     "duration_s": round(r.duration_us / 1e6, 6)}
                    for r in stalls.head(MAX_LISTED).itertuples()]}, round(excess_us / 1e6, 3))]


def _binomial_tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return float(sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1)))


_IN_ORDER = ("`in_order=False` on the DataLoader (torch >= 2.6) lets the other workers' batches "
             "through meanwhile, at the cost of batch order")


def _fetches(node: _Node, loader: _Loader) -> pd.DataFrame:
    """Worker-side fetch events (this project's collector) of the loader's iterators."""
    fetch = node.fetches
    if fetch.empty:
        return fetch
    ids = loader.calls["iterator_id"].dropna().unique()
    if len(ids):
        return fetch[fetch["iterator_id"].isin(ids)]
    lo, hi = int(loader.calls["start_us"].min()), int(loader.calls["end_us"].max())
    return fetch[(fetch["end_us"] >= lo) & (fetch["start_us"] <= hi)]


def _slow_worker(node: _Node, factor: float) -> list[Recommendation]:
    found = []
    for loader in node.loaders:
        steady = loader.steady
        baseline = loader.steady_median_us
        if baseline is None:
            continue
        known = steady[steady["worker_id"].notna() & (steady["worker_id"].fillna(-1) >= 0)]
        if known["worker_id"].nunique() >= 2:
            item = _slow_worker_by_id(node, loader, known, baseline, factor)
        elif loader.multi_process and known.empty:
            item = _slow_worker_by_period(node, loader, factor)
        else:
            item = None
        if item is not None:
            found.append(item)
    return found


def _slow_worker_by_id(node, loader, known, baseline, factor) -> Recommendation | None:
    workers = max(int(loader.num_workers or 0), int(known["worker_id"].nunique()))
    stalls = known[known["duration_us"] > factor * max(baseline, 1.0)]
    fetch = _fetches(node, loader)
    fetch = fetch[fetch["worker_id"].notna()]
    by_fetch = fetch["worker_id"].nunique() >= 2
    best = None
    worker_ids = known["worker_id"].to_numpy(dtype=np.int64)
    durations = known["duration_us"].to_numpy(dtype=np.float64)
    for worker, mine in known.groupby(worker_ids):
        others_median = float(np.median(durations[worker_ids != worker]))
        median = float(mine["duration_us"].median())
        on_worker = int((stalls["worker_id"] == worker).sum())
        p_value = (workers * _binomial_tail(len(stalls), on_worker, 1.0 / workers)
                   if len(stalls) >= 3 and on_worker else 1.0)
        fetch_median = fetch_others = None
        if by_fetch:  # the worker's own times decide
            fetch_median = float(fetch.loc[fetch["worker_id"] == worker, "duration_us"].median())
            fetch_others = float(fetch.loc[fetch["worker_id"] != worker, "duration_us"].median())
            slow = (not math.isnan(fetch_median)
                    and fetch_median >= SLOW_WORKER_FACTOR * max(fetch_others, 1.0))
        else:
            slow = ((len(mine) >= MIN_BATCHES and median >= SLOW_WORKER_WAIT_FACTOR * max(others_median, 1.0))
                    or (on_worker >= 3 and p_value < SLOW_WORKER_P_VALUE))
        excess = float((mine["duration_us"] - others_median).clip(lower=0).sum())
        if slow and _worth(node, excess) and (best is None or excess > best[0]):
            best = (excess, int(worker), mine, median, others_median, on_worker, p_value, fetch_median,
                    fetch_others)
    if best is None:
        return None
    excess, worker, mine, median, others_median, on_worker, p_value, fetch_median, fetch_others = best
    slow = mine[mine["duration_us"] > factor * max(others_median, 1.0)]
    listed = _batch_list(slow, _segment_numbers(loader))
    batches = ", ".join(f"{b['batch']}" for b in listed[:10])
    stalls_total = len(stalls)
    text = (f"Worker {worker} of {_loader_name(loader)} on {node.node} is slow: "
            + (f"it takes {_s(fetch_median)} median to fetch a batch against {_s(fetch_others)} for the "
               f"other workers, and " if fetch_median is not None else "")
            + f"its batches wait {_s(median)} median against {_s(others_median)} for the other "
            f"workers' batches"
            + (f"; {on_worker} of the {stalls_total} GetNext stalls are its batches" if on_worker else "")
            + f" (batches {batches}{'...' if len(slow) > 10 else ''}). With in-order delivery every batch "
            f"queued behind it waits too (head-of-line blocking). Find why that worker is slow (a shard "
            f"of slow files, a skewed sampler, a slow sample it always gets); {_IN_ORDER}. "
            f"Its stalls cost {_s(excess)}.")
    return Recommendation("slow_worker", text, {
        "node": node.node, "loader": loader.name, "num_workers": workers, "worker_id": worker,
        "median_getnext_s": round(median / 1e6, 6), "others_median_getnext_s": round(others_median / 1e6, 6),
        "fetch_median_s": None if fetch_median is None else round(fetch_median / 1e6, 6),
        "others_fetch_median_s": None if fetch_others is None else round(fetch_others / 1e6, 6),
        "batches_of_worker": int(len(mine)), "slow_batches": int(len(slow)), "stalls_on_worker": on_worker,
        "stalls_total": stalls_total, "p_value": None if p_value >= 1.0 else float(f"{p_value:.3g}"),
        "period": None, "batches": listed}, round(excess / 1e6, 3))


def _slow_worker_by_period(node, loader, factor) -> Recommendation | None:
    """A stall every p batches with worker ids unknown: one slow worker among p.

    A stall is a wait over `factor` x the lower quartile (batches that were ready) and over
    the median: with 2 workers half the batches may stall, and the median falls between.
    """
    durations = loader.steady["duration_us"]
    ready = float(durations.quantile(0.25))
    baseline = float(durations.median())
    threshold = max(factor * max(ready, 1.0), baseline)
    hits = []
    for segment, group in loader.calls.groupby("segment", sort=False):
        # not the first (start-up) nor the last (Kineto: StopIteration, shutting workers down)
        inner = group[(group["index"] > 0) & (group["index"] < group["index"].max())]
        stalls = inner[inner["duration_us"] > threshold]
        if len(stalls) < PERIOD_MIN_STALLS:
            continue
        gaps = np.diff(stalls["index"].to_numpy())
        values, counts = np.unique(gaps, return_counts=True)
        period = int(values[np.argmax(counts)])
        if period < 2 or period > PERIOD_MAX or counts.max() < PERIOD_GAP_SHARE * len(gaps):
            continue
        if len(stalls) < PERIOD_COVERAGE * (len(group) - 1) / period:
            continue
        residues = stalls["index"].to_numpy() % period
        r_values, r_counts = np.unique(residues, return_counts=True)
        # batch i goes to worker i mod p, if the recording starts with the iterator (its first
        # batch paid start-up); else the worker cannot be told.
        starts_fresh = float(group["duration_us"].iloc[0]) >= STARTUP_FACTOR * max(ready, 1.0)
        worker = int(r_values[np.argmax(r_counts)]) if starts_fresh and r_counts.max() >= 0.8 * len(stalls) \
            else None
        hits.append((segment, period, worker, stalls))
    if not hits:
        return None
    periods = {p for _, p, _, _ in hits}
    period = max(periods, key=lambda p: sum(len(s) for _, q, _, s in hits if q == p))
    hits = [h for h in hits if h[1] == period]
    workers = {w for _, _, w, _ in hits}
    worker = workers.pop() if len(workers) == 1 else None
    stalls = pd.concat([s for _, _, _, s in hits])
    others = loader.steady[~loader.steady.index.isin(stalls.index)]["duration_us"]
    others_median = float(others.median()) if len(others) else ready
    excess = float((stalls["duration_us"] - others_median).clip(lower=0).sum())
    if not _worth(node, excess):
        return None
    listed = _batch_list(stalls, _segment_numbers(loader))
    batches = ", ".join(str(b["batch"]) for b in listed[:10])
    who = (f"likely worker {worker} (batch i is fetched by worker i mod {period})" if worker is not None
           else "the worker cannot be named (the recording did not start with the iterator)")
    text = (f"A stall every {period} batches of {_loader_name(loader)} on {node.node}: batches {batches}"
            f"{'...' if len(stalls) > 10 else ''} wait {_s(float(stalls['duration_us'].median()))} median "
            f"against {_s(others_median)} for the others. That is head-of-line blocking behind one slow "
            f"worker among {period}: {who}; worker ids are not recorded by this trace. Find why that "
            f"worker is slow (a shard of slow files, a skewed sampler); {_IN_ORDER}. "
            f"The stalls cost {_s(excess)}.")
    return Recommendation("slow_worker", text, {
        "node": node.node, "loader": loader.name, "num_workers": loader.num_workers, "worker_id": worker,
        "period": period, "median_getnext_s": round(float(stalls["duration_us"].median()) / 1e6, 6),
        "others_median_getnext_s": round(others_median / 1e6, 6), "slow_batches": int(len(stalls)),
        "batches": listed}, round(excess / 1e6, 3))


def _pin_memory(node: _Node) -> list[Recommendation]:
    if not node.gpus:
        return []
    for loader in node.loaders:
        if loader.pin_memory is False:
            text = (f"{_loader_name(loader)} on {node.node} has pin_memory=False while the host has "
                    f"{node.gpus} GPU(s) in the system metrics: set `pin_memory=True` so batches are "
                    f"copied to the GPU from page-locked memory, and overlap the copy with compute via "
                    f"`.to(device, non_blocking=True)`.")
            return [Recommendation("pin_memory", text, {"node": node.node, "loader": loader.name,
                                                        "num_workers": loader.num_workers,
                                                        "gpus": node.gpus}, None)]
    return []


_ORDER = ("use_workers", "cpu_saturated", "more_workers", "persistent_workers", "slow_worker",
          "storage_bound", "startup", "pin_memory")


def _merge_nodes(found: list[Recommendation]) -> list[Recommendation]:
    """One finding per kind: the one saving most, naming the other nodes where it applies."""
    by_id: dict[str, list[Recommendation]] = {}
    for item in found:
        by_id.setdefault(item.id, []).append(item)
    merged = []
    for kind, items in by_id.items():
        items.sort(key=lambda r: -(r.saving_s or 0.0))
        head = items[0]
        nodes = sorted({r.evidence.get("node") for r in items})
        if len(nodes) > 1:
            others = [n for n in nodes if n != head.evidence.get("node")]
            head = Recommendation(head.id, head.text + f" The same holds on {len(others)} other node(s): "
                                  + ", ".join(others[:MAX_LISTED]) + ".",
                                  {**head.evidence, "nodes": nodes}, head.saving_s)
        merged.append(head)
    merged.sort(key=lambda r: (r.saving_s is None, -(r.saving_s or 0.0), _ORDER.index(r.id)))
    return merged


def assess(framework: pd.DataFrame, system: pd.DataFrame,
           outlier_factor: float = DEFAULT_OUTLIER_FACTOR) -> Assessment:
    """The trial's verdict, each node's, and the recommendations."""
    nodes = _nodes(framework, system)
    found: list[Recommendation] = []
    for node in nodes:
        stalls = _slow_worker(node, outlier_factor) + _storage(node, outlier_factor)
        getnext_us = float(node.training_calls["duration_us"].sum())
        if not any(r.saving_s and r.saving_s * 1e6 >= EXPLAINED_SHARE * getnext_us for r in stalls):
            found += _workers(node)
        found += stalls
        found += _persistent_workers(node)
        found += _startup(node)
        found += _pin_memory(node)
    return Assessment(_trial_verdict(nodes), {n.node: n.verdict for n in nodes}, _merge_nodes(found))


def verdict(framework: pd.DataFrame) -> Verdict:
    """The trial's verdict alone."""
    return _trial_verdict(_nodes(framework, pd.DataFrame()))
