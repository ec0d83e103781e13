"""A model of torch's DataLoader pipeline (`_MultiProcessingDataLoaderIter`, torch 2.x):
what a trial's records imply about each batch, and a replay of it under other settings.

How the iterator moves batches (torch/utils/data/dataloader.py, confirmed against 2.13):
`_reset()` primes `prefetch_factor x num_workers` tasks; each `next()` that returns a
batch sends one more (`_process_data` -> `_try_put_index`), so that many are in flight.
In order (the default) batch b of an epoch goes to worker b mod num_workers and `next()`
returns batch b only, storing earlier arrivals; out of order a task goes to the next
worker in the cycle with fewer than `prefetch_factor` outstanding, and `next()` returns
whatever arrives first. A worker serves its tasks one after another.

What is inferred from a trial (per loader, per batch, in its iterator's order):
- the worker of each batch: recorded (collector, reference) or b mod num_workers;
- compute: the main process's time from one GetNext's end to the next one's start; the
  last batch of an iterator gets the iterator's median (an estimate). The step after a long
  wait runs slower (its core idled: cold caches); where that stands out from the noise the
  replay charges it for the wait it replays (see _idle_compute);
- the delivery cost: what a GetNext costs when its batch is already there (unpickling,
  shared-memory tensors): the median wait of batches whose fetch ended before they were
  asked for (collector), else a low quantile of the waits, capped (an estimate). The replay
  tells three kinds apart where the collector measured the fetches: a next() that waits for
  its batch and takes it from the result queue, one whose batch was in the queue when it
  asked, and one that returns a batch stored earlier (in order, taken off the queue while an
  earlier one was waited for): on a busy host the first two cost a round trip to the worker,
  the first also a wake-up, the third nothing of the kind (see _delivery_by_path);
- the service time: the worker's fetch of that batch, where the collector recorded it
  (measured, with its CPU time). Without fetch events it is inferred: a batch that was
  waited for became ready at the end of its GetNext less the delivery cost, and its
  worker started it when its previous batch was ready or when it was sent (the return of
  the batch `prefetch` places earlier), whichever came later; batches that were already
  there only bound their service from above, so they get their worker's (else the
  loader's) median (an estimate, and the model says so);
- the start-up of workers that an iterator created: the time from its first GetNext to
  its workers' first fetch, plus what their first fetch took beyond their median (a
  dataset opened lazily in each new process), else inferred from the first batches;
- CPU: a service time is a part that needs a core (the fetch's CPU time) and a part that
  waits (storage, network, locks). When the workers' demand for cores exceeds the cores
  left to them (the host's cores less the main process's compute and other load), the
  computing part stretches; the waiting part never does. Where the kernel measured the
  fetches' queueing for a core, today's stretch is that (PipelineModel.cpu_stretch).

The replay runs the iterator's protocol batch by batch with those inputs and changed
settings. It is exact for the protocol and approximate in its inputs; a prediction is the
changed replay scaled by how today's measured wait compares with today's replay (what the
model does not capture, a busy host's wake-ups and hand-overs, grows and shrinks with the
waiting the model does capture; see what_if). Large loaders are replayed on
an even sample of their iterators, each up to its first `replay_cap` batches (at most
MAX_REPLAY_BATCHES batches in all), and scaled: an iterator's batches beyond its cap wait as
the second half of its replayed ones did (its steady state).
"""
from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .loaders import Loader, ProcessTraining, iterator_codes

# Waits below delivery cost + this are "the batch was there": timer and scheduling noise
# on a busy host is of this order (a context switch, a wake-up of the main thread).
READY_SLACK_US = 200.0
# Without fetch events the delivery cost is read from the waits near this low quantile,
# capped: torch's per-batch cost is 0.3-1 ms for small batches (DATALOADER-PIPELINE.md);
# a higher one means every batch waited (workers too slow), not a costlier delivery.
DELIVERY_QUANTILE = 0.05
DELIVERY_CAP_US = 1_000.0
# Delivery cost assumed for a loader that has no workers today (num_workers=0 -> N).
DEFAULT_DELIVERY_US = 500.0
# Received batches of one kind (waited for, or there at the ask) that measure what such a
# next() costs: fewer are a mean of a few hand-overs whose tail is wide on a busy host (see
# _delivery_by_path).
MIN_RECEIVED = 10
# The replay's work is bounded: a Python step per batch, about 2 us each.
MAX_REPLAY_BATCHES = 20_000
# Fetches whose CPU work took this much longer for queueing on a run queue (schedstat)
# had the cores they could get: the workers' share of the cores is what they used.
CONTENDED = 1.1
# Cores are never thought to be fewer than this for the workers (a loaded host still
# gives them some time).
MIN_WORKER_CORES = 0.25


@dataclass(frozen=True)
class Settings:
    num_workers: int
    prefetch_factor: int
    in_order: bool
    persistent_workers: bool

    def changed(self, change: dict) -> "Settings":
        values = {**self.__dict__, **change}
        return Settings(int(values["num_workers"]), int(values["prefetch_factor"]),
                        bool(values["in_order"]), bool(values["persistent_workers"]))


@dataclass
class PipelineModel:
    """One loader as the pipeline model sees it. Arrays are per batch, in iterator order."""
    settings: Settings
    delivery_us: float  # what a GetNext of a batch its worker had finished costs (median)
    delivery_base_us: float  # of it, delivery itself: the short ones' median (see build)
    # What the replay charges a next() (see build): in order, one that waited for its batch and
    # took it from the result queue, one whose batch was in the queue when it asked, and one whose
    # batch the main process took off the queue earlier (while it waited for an earlier batch)
    # and stored; out of order, each taking its own batch off the queue (see _delivery_by_path).
    waited_us: float
    ready_us: float
    stored_us: float
    out_of_order_us: float
    ready_measured: bool  # ready_us is the mean of MIN_RECEIVED or more (else a midpoint)
    service_measured: bool  # fetch events (collector) gave the service times
    cpu_measured: bool  # fetch events carried the worker's CPU time
    cores: int | None
    cores_for_workers: float | None  # None: unknown, no stretching modelled
    worker_cpu_cores: float | None  # the workers' CPU use today, in cores
    speed: np.ndarray  # per worker: its median service over all workers' median
    # every batch (segment, index and wait_us are the calls frame's own arrays, shared: never
    # written in place)
    segment: np.ndarray  # 0.. in time order
    index: np.ndarray
    worker: np.ndarray  # the worker that served it, -1 unknown / main process (int16)
    wait_us: np.ndarray
    compute_us: np.ndarray
    service_us: np.ndarray  # as served today (NaN for a single-process loader: wait_us)
    runq_us: np.ndarray  # of it, queueing for a core (NaN: not measured)
    # From the end of the batch's fetch (or the ask, if later) to next()'s return: its
    # hand-over, measured where the collector recorded the fetch (NaN: not measured).
    handover_us: np.ndarray
    recreated: np.ndarray  # per segment: its workers were started by it
    startup_us: np.ndarray  # per segment x worker (num_workers columns): start-up latency
    # the replay's inputs (a sample of the segments)
    replay_segments: np.ndarray  # segment ids replayed
    replay_scale: float  # all batches / the replayed segments' batches
    replay_cap: int  # batches replayed per segment, its first ones
    replay_beyond: np.ndarray  # per replayed segment: its batches beyond the cap
    latency_base_us: np.ndarray  # per batch: the waiting part, at speed 1
    cpu_base_us: np.ndarray  # per batch: the computing part, at speed 1, unstretched
    # their means over all batches (what the stretch reads; a compact model keeps them)
    mean_latency_us: float = 0.0
    mean_cpu_us: float = 0.0
    mean_compute_us: float = 0.0
    iterator_batches: int = 0  # an iterator's batches, where the trial shows them (_iterator_batches; 0: unknown)
    main_cores: float = 0.0  # the main process's use of the cores in training
    other_cores: float = 0.0  # other processes' use of the host's cores in training
    contention: float | None = None  # (cpu + run-queue wait) / cpu of the fetches, measured
    # The main process's compute beyond its steady compute in the first batches after each
    # start of new workers (forking them slows the parent: copy-on-write faults, the new
    # processes taking the cores): what persistent workers also save, per start.
    startup_compute_us: float = 0.0
    # How much longer the training loop's step after a long wait ran than its other steps (us; 0:
    # none told from noise), and the median of those waits, from which a step pays it in full
    # (see _idle_compute).
    idle_compute_us: float = 0.0
    idle_full_wait_us: float = 0.0
    # Per segment, its first batches (by number) whose compute _startup_compute counts.
    startup_rows: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    today_us: float = 0.0  # the replay's total wait under today's settings
    today_idle_charged_us: float = 0.0  # ...and the idle compute it charges the steps (_idle_compute)
    # ...and per replayed segment, each next()'s (the budget's residual reads it; a compact
    # model drops it)
    today_waits: list = dataclasses.field(default_factory=list)

    @property
    def batches(self) -> int:
        return len(self.wait_us)

    @property
    def handoff_us(self) -> float:
        """What a batch its worker had finished waited beyond delivery itself to be handed over:
        the mean of those taken from the queue (not stored) where MIN_RECEIVED were, else the
        delivery cost's (see _delivery_by_path)."""
        return (self.ready_us if self.ready_measured else self.delivery_us) - self.delivery_base_us

    def compact(self) -> "PipelineModel":
        return compact(self)

    def cores_for(self, workers: int) -> float | None:
        """The cores `workers` workers get. On a saturated host the scheduler shares the
        cores between runnable threads: more workers take a larger share from the main
        process and from other processes (each wanting the cores it uses now). Anchored
        to the share today's workers got."""
        if self.cores_for_workers is None:
            return None
        today = max(self.settings.num_workers, 1)
        if workers == today or not self.cores:
            return self.cores_for_workers
        demand = self.mean_cpu_us / max(self.mean_cpu_us + self.mean_latency_us, 1e-9)  # runnable share

        def runnable(count: int) -> float:
            return count * demand + self.other_cores + self.main_cores

        def share(count: int) -> float:
            return count * demand / max(runnable(count), 1e-9)

        scaled = self.cores_for_workers * share(workers) / max(share(today), 1e-9)
        # The main process keeps its share of the same fair scheduling, no more: capping the
        # workers at the cores less all of today's main-process use (as once) gave more
        # workers fewer cores than today's on a quiet saturated host, and predicted a
        # slowdown where the re-runs gained (2 -> 4 workers on 2 cores: -0.08 predicted,
        # +0.01..+0.08 measured in 5 pairs).
        main_keeps = self.main_cores * runnable(today) / max(runnable(workers), 1e-9)
        return max(MIN_WORKER_CORES, min(scaled, self.cores - main_keeps))

    def cpu_stretch(self, workers: int) -> float:
        """How much the computing part of a fetch stretches with `workers` workers, as the replay
        charges it: the model's stretch, anchored to today's where the kernel measured it
        (`contention`). The model's stretch is the workers' own demand for the cores; what other
        processes and the main process add to their queueing (today's measured over the model's
        own for today's workers) stays. (The slow_worker job beside two busy processes: its fetches
        measured 2.7x, the model's own stretch was 1.0, and the replay left each fetch's queueing
        out, 0.11 s of the slow worker's 0.70 s of waits: calibrated on that, out-of-order's
        predicted wait was 1.2x too high.)"""
        own = self.stretch(workers)
        if self.contention is None:
            return own
        return own * self.contention / self.stretch(max(self.settings.num_workers, 1))

    def stretch(self, workers: int) -> float:
        """How much the computing part of a fetch stretches with `workers` workers: those an
        iterator keeps busy, no more than its batches (a worker with no batch to fetch takes no
        core; counted, 256 workers for iterators of 8 batches predicted 31x today's training)."""
        if self.iterator_batches:
            workers = min(workers, self.iterator_batches)
        cpu, latency = self.mean_cpu_us, self.mean_latency_us
        cores = self.cores_for(workers)
        if workers <= 0 or cores is None or cpu <= 0:
            return 1.0
        consume = self.mean_compute_us + self.delivery_us
        # Workers deliver at most W / service batches per second, and the main process
        # takes at most 1 / (compute + delivery); the cores bound the workers to A / cpu.
        rate = min(workers / max(latency + cpu, 1e-9), 1.0 / consume if consume > 0 else np.inf)
        if rate * cpu <= cores:
            return 1.0
        per_worker = workers * cpu / cores  # each worker's wall per batch
        return max(1.0, (per_worker - latency) / cpu)


def _iterator_batches(segment: np.ndarray) -> int:
    """The batches of the loader's iterators where the trial shows them whole, else 0 (unknown).
    Its first and last iterators may be cut by the recording (a profiling window of a few steps
    records a few batches of a long iterator: taken for its length, 64 workers were predicted as
    16); those between them, two or more of one length, ran whole: an epoch's batches."""
    counts = np.bincount(segment) if len(segment) else np.zeros(0, np.int64)
    counts = counts[counts > 0]  # (the iterators present, in order: np.unique's sort of 3M batches not needed)
    inner = counts[1:-1]
    return int(inner[0]) if len(inner) >= 2 and (inner == inner[0]).all() else 0


def compact(model: PipelineModel) -> PipelineModel:
    """The model with only the batches the replay reads (a what-if later, from a cache)."""
    keep = replayed_rows(model)
    per_batch = ("segment", "index", "worker", "wait_us", "compute_us", "service_us", "runq_us", "handover_us",
                 "latency_base_us", "cpu_base_us")
    values = {name: getattr(model, name)[keep] for name in per_batch}
    return dataclasses.replace(model, **values, today_waits=[])


def first_index(segment: np.ndarray, index: np.ndarray, segments: int) -> np.ndarray:
    """Each iterator's first batch number (its batches in order, iterator by iterator)."""
    starts = np.flatnonzero(np.r_[True, segment[1:] != segment[:-1]]) if len(segment) else np.zeros(0, np.int64)
    first = np.zeros(segments, dtype=np.int64)
    first[segment[starts]] = index[starts]
    return first


def _mean(values) -> float | None:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(np.mean(values)) if len(values) else None


def _median(values) -> float | None:
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]  # (a copy of its own: the median may reorder it)
    return float(np.median(values, overwrite_input=True)) if len(values) else None


def _fetch_matches(loader: Loader, fetches: pd.DataFrame) -> pd.DataFrame | None:
    """Each batch's fetch: the k-th fetch of a worker for an iterator served that
    worker's k-th batch of it. A fetch belongs to the iterator named by its iterator_id
    (collector), else to the one running when it started (after the previous iterator's
    last GetNext: the first fetches run ahead of the first GetNext). None when the loader
    has no fetch events or its batches name no worker."""
    calls = loader.calls
    if fetches.empty or calls["worker_id"].isna().all():
        return None
    lo, hi = int(calls["start_us"].min()), int(calls["end_us"].max())
    fetch = fetches[fetches["worker_id"].notna()]
    ids = calls["iterator_id"].dropna().unique()
    by_id = len(ids) and not calls["iterator_id"].isna().any() and fetch["iterator_id"].isin(ids).any()
    segments = calls.groupby("segment", sort=False).agg(first=("start_us", "first"), last=("end_us", "max"),
                                                        iterator_id=("iterator_id", "first"))
    if by_id:
        fetch = fetch[fetch["iterator_id"].isin(ids)]
        seg_of_id = pd.Series(segments.index.to_numpy(), index=segments["iterator_id"].to_numpy())
        seg_of_id = seg_of_id[~seg_of_id.index.duplicated()]
        fetch_segment = seg_of_id.reindex(fetch["iterator_id"].to_numpy()).to_numpy()
    else:
        previous_last = np.r_[-np.inf, segments["last"].to_numpy()[:-1]]
        fetch = fetch[(fetch["end_us"] <= hi) & (fetch["start_us"] >= lo - 3_600_000_000)]
        at = np.searchsorted(previous_last, fetch["start_us"].to_numpy(), side="right") - 1
        fetch_segment = segments.index.to_numpy()[np.clip(at, 0, None)]
    if fetch.empty:
        return None
    fetch = fetch.assign(segment=fetch_segment).sort_values("start_us", kind="stable")
    fetch = fetch.assign(k=fetch.groupby(["segment", "worker_id"]).cumcount())
    keyed = pd.DataFrame({"segment": calls["segment"].to_numpy(), "worker_id": calls["worker_id"].to_numpy()})
    keyed["k"] = keyed.groupby(["segment", "worker_id"]).cumcount()
    return keyed.merge(fetch[["segment", "worker_id", "k", "start_us", "end_us", "duration_us", "cpu_us", "runq_us"]],
                       on=["segment", "worker_id", "k"], how="left")


def build(loader: Loader, process: ProcessTraining) -> PipelineModel:
    calls = loader.calls
    n = len(calls)
    workers = int(loader.num_workers or 0)
    segment = iterator_codes(calls)
    index = calls["index"].to_numpy(dtype=np.int64)
    ask = calls["start_us"].to_numpy(dtype=np.float64)
    ret = calls["end_us"].to_numpy(dtype=np.float64)
    wait = calls["duration_us"].to_numpy(dtype=np.float64)
    compute = calls["compute_us"].to_numpy(dtype=np.float64)
    fill = _median(compute)
    compute = np.where(np.isfinite(compute), np.maximum(compute, 0.0), fill if fill is not None else 0.0)
    segments = int(segment.max()) + 1 if n else 0
    first_ask = np.full(segments, np.nan)
    first_ask[segment[::-1]] = ask[::-1]  # each segment's first GetNext start
    recorded = calls["worker_id"].to_numpy(dtype=np.float64, na_value=np.nan)
    if workers:
        # The recorded worker where it is one of the loader's, else the batch's in the cycle.
        # (Filled in place, in the narrow type: the full-length temporaries of a np.where were
        # the model's peak.)
        worker = (index % workers).astype(_worker_type(workers))
        known = np.isfinite(recorded) & (recorded >= 0) & (recorded < workers)
        worker[known] = recorded[known]
        del known
    else:
        worker = np.full(n, -1, dtype=_worker_type(workers))
    persistent = bool(loader.persistent)
    recreated = np.zeros(segments, dtype=bool)
    if segments:
        recreated[:] = not persistent
        recreated[0] = True
        # (an iterator a recording began in, rounds.inferred_rounds: its workers were long started)
        recreated &= first_index(segment, index, segments) == 0
    del recorded
    # Before the model's own per-batch arrays exist: its temporaries were the assessment's peak
    # (at 300k GetNexts, 8 MB on top of the 40 MB the model then held).
    startup_rows = _startup_rows(segment, recreated, segments)
    startup_compute = _startup_compute(compute, segment, index, recreated, startup_rows) if workers else 0.0
    settings = Settings(workers, loader.prefetch_factor, loader.in_order, persistent)
    matched = _fetch_matches(loader, process.fetches) if workers else None
    # (service, each batch's time in a worker: each branch below makes it its own way)
    cpu = runq = handover = _not_measured(n)
    startup = np.zeros((segments, max(workers, 1)))

    measured = False
    if not workers:  # the main process loads each batch inside next()
        service = wait.copy()
        delivery = delivery_base = 0.0
        costs = _DeliveryCosts.every(0.0)
    elif matched is not None and matched["duration_us"].notna().mean() >= 0.5:
        fetch_start = matched["start_us"].to_numpy(dtype=np.float64, na_value=np.nan)
        fetch_end = matched["end_us"].to_numpy(dtype=np.float64, na_value=np.nan)
        service = matched["duration_us"].to_numpy(dtype=np.float64, na_value=np.nan).copy()
        cpu = matched["cpu_us"].to_numpy(dtype=np.float64, na_value=np.nan).copy()
        runq = matched["runq_us"].to_numpy(dtype=np.float64, na_value=np.nan).copy()
        ready_before = np.isfinite(fetch_end) & (fetch_end <= ask)
        # (np.maximum, not fmax: NaN where no fetch matched, where fmax gave the whole wait)
        handover = np.clip(ret - np.maximum(ask, fetch_end), 0.0, wait)
        # A batch whose fetch had ended before the ask still waits for its hand-over: the
        # worker's queue thread pickles it and passes its shared memory, and on a worker
        # that computes in Python that thread first waits for the GIL the next sample holds
        # (the switch interval, 5 ms: with sys.setswitchinterval(0.0005) the cpu scenario's
        # ready batches waited 1.2-2.5 ms instead of 6.1-6.6). The median is what a ready
        # batch costs today (the replay charges each kind of next() its own mean:
        # _delivery_by_path); the short ones are the cost of delivery itself, which no change
        # of the samples' work removes.
        delivery = _median(wait[ready_before]) if ready_before.any() else None
        if delivery is None:
            delivery = _delivery_from_waits(wait)
            delivery_base = delivery
        else:
            delivery_base = min(delivery, _delivery_from_waits(wait[ready_before]))
        costs = _delivery_by_path(segment, fetch_end, ask, handover, settings.in_order, delivery, delivery_base)
        # Start-up of the workers an iterator created: from its first GetNext to each
        # worker's first fetch, plus that fetch's time beyond the worker's median.
        for w in range(workers):
            mine = np.flatnonzero(worker == w)
            med = _median(service[mine])
            if med is None:
                continue
            of_segment = segment[mine]
            firsts = mine[np.r_[True, of_segment[1:] != of_segment[:-1]]]  # its first batch in each
            seg = segment[firsts]
            late = np.nan_to_num(fetch_start[firsts] - first_ask[seg], nan=0.0).clip(min=0.0)
            extra = np.nan_to_num(service[firsts] - med, nan=0.0).clip(min=0.0)
            startup[seg, w] = np.where(recreated[seg], late + extra, 0.0)
            service[firsts] = np.where(recreated[seg], np.fmin(service[firsts], med), service[firsts])
        measured = True
    else:
        # Without fetch events a next() cannot be told to have taken its batch from the queue
        # or from the stored ones: every one is charged the same.
        delivery = delivery_base = _delivery_from_waits(wait)
        costs = _DeliveryCosts.every(delivery)
    if workers and not measured:
        service, startup = _inferred_service(
            segment, index, worker, ask, ret, wait, delivery, workers,
            workers * loader.prefetch_factor, first_ask, recreated)
    del ask, ret, matched  # (the matched fetches' columns: copied above where needed)
    if workers:
        # Batches without a measured or inferred service: their worker's median, else all.
        overall = _median(service) or 0.0
        if not measured:
            _fill_unwaited_service(service, worker, workers, compute, delivery, overall)
        for w in range(workers):
            mine = (worker == w) & ~np.isfinite(service)
            if mine.any():
                service[mine] = _median(service[worker == w]) or overall
        service = np.where(np.isfinite(service), service, overall)
        medians = np.array([_median(service[worker == w]) or overall for w in range(workers)])
        speed = medians / overall if overall > 0 else np.ones(workers)
        speed = np.where(np.isfinite(speed) & (speed > 0), speed, 1.0)
    else:
        speed = np.ones(0)

    cores = process.cores
    util = process.training_cpu_percent
    training_us = max(float(process.training_us), 1.0)
    main_cores = min(1.0, float(np.sum(compute)) / training_us)
    cpu_measured = bool(workers) and bool(np.isfinite(cpu).mean() >= 0.5)
    contention = None  # today's stretch of the CPU work, where the kernel measured it
    if cpu_measured:
        cpu = np.where(np.isfinite(cpu), np.minimum(cpu, service), np.nanmedian(cpu))
        worker_cores = float(np.sum(cpu)) / training_us
        if np.isfinite(runq).mean() >= 0.5 and float(np.sum(cpu)) > 0:
            runq = np.where(np.isfinite(runq), np.clip(runq, 0.0, service - cpu), np.nanmedian(runq))
            contention = float(np.sum(cpu + runq)) / float(np.sum(cpu))
    elif util is not None and cores:
        # No CPU time per fetch: the host's use beyond the main process's is the
        # workers' (an estimate), shared over their service time.
        # Busy workers use at most a core each: the rest of the host's use is someone else's.
        busy = busy_workers(service, training_us)
        worker_cores = min(max(0.0, util / 100.0 * cores - main_cores), busy)
        share = min(1.0, worker_cores / busy) if busy > 0 else 0.0
        cpu = service * share
    else:
        worker_cores = None
        cpu = np.zeros(n)
    cores_for_workers = None
    if cores:
        free = cores - main_cores
        if util is not None and worker_cores is not None:
            free = min(free, cores * (1.0 - util / 100.0) + worker_cores)
        if cpu_measured and float(np.sum(service)) > 0:
            # While busy the workers demonstrably used this many cores: no fewer are theirs;
            # and where they queued for a core meanwhile, no more either.
            used = workers * float(np.sum(cpu)) / float(np.sum(service))
            free = used if contention is not None and contention > CONTENDED else max(free, used)
        cores_for_workers = max(MIN_WORKER_CORES, free)
    other_cores = 0.0
    if cores and util is not None:
        other_cores = max(0.0, util / 100.0 * cores - (worker_cores or 0.0) - main_cores)

    model = PipelineModel(
        settings=settings, delivery_us=float(delivery), delivery_base_us=float(delivery_base),
        waited_us=float(costs.waited_us), ready_us=float(costs.ready_us), stored_us=float(costs.stored_us),
        out_of_order_us=float(costs.out_of_order_us), ready_measured=costs.ready_measured,
        service_measured=measured, cpu_measured=cpu_measured,
        cores=cores, cores_for_workers=cores_for_workers, worker_cpu_cores=worker_cores, speed=speed,
        segment=segment, index=index, worker=worker, wait_us=wait, compute_us=compute, service_us=service,
        runq_us=runq if contention is not None else _not_measured(n), handover_us=handover,
        recreated=recreated, startup_us=startup,
        replay_segments=np.zeros(0, dtype=np.int64), replay_scale=1.0, replay_cap=0,
        replay_beyond=np.zeros(0, dtype=np.int64),
        latency_base_us=np.zeros(0), cpu_base_us=np.zeros(0), main_cores=main_cores, other_cores=other_cores)
    model.mean_compute_us = float(np.mean(compute)) if n else 0.0
    model.iterator_batches = _iterator_batches(segment)
    # The unstretched parts at speed 1: today's service = (latency + cpu x stretch) x speed.
    # (In place where it can be, and each array let go once read: the arrays of the batches
    # held here were the assessment's peak, 24 MB each at 3M batches.)
    per_speed = speed[worker] if workers else np.ones(n)
    cpu_base = np.divide(cpu, per_speed)
    measured_latency = None
    if contention is not None:
        # Measured: the waiting part is what is neither CPU work nor queueing for a core.
        measured_latency = np.add(cpu, runq)
        np.divide(measured_latency, per_speed, out=measured_latency)
    del cpu
    base = np.divide(service, per_speed)
    del per_speed
    np.minimum(cpu_base, base, out=cpu_base)
    model.cpu_base_us = cpu_base
    model.mean_cpu_us = float(np.mean(cpu_base)) if n else 0.0
    if measured_latency is not None:
        np.subtract(base, measured_latency, out=measured_latency)
        model.latency_base_us = np.maximum(measured_latency, 0.0, out=measured_latency)
        model.mean_latency_us = float(np.mean(model.latency_base_us)) if n else 0.0
    else:
        # Today's stretch, first as if nothing waited beyond the CPU work; then the waiting
        # part is what today's service leaves once the CPU work is stretched.
        latency = np.subtract(base, cpu_base)
        model.mean_latency_us = float(np.mean(latency)) if n else 0.0
        # A loader without workers loads in one process, as one worker would: same contention.
        sigma = model.stretch(max(workers, 1))
        np.multiply(cpu_base, sigma, out=latency)
        np.subtract(base, latency, out=latency)
        model.latency_base_us = np.maximum(latency, 0.0, out=latency)
        model.mean_latency_us = float(np.mean(model.latency_base_us)) if n else 0.0
    del base
    model.contention = contention
    model.startup_compute_us = startup_compute
    model.startup_rows = startup_rows
    if workers:
        model.idle_compute_us, model.idle_full_wait_us = _idle_compute(
            compute, wait, index, segment, workers, model.startup_rows, delivery, model.mean_compute_us)
    model.replay_segments, model.replay_scale, model.replay_cap, model.replay_beyond = _sample(segment, segments)
    today = _replay(model, settings)
    model.today_waits = [(seg, waits) for seg, waits, _ in today]
    totals = _totals(model, today)
    model.today_us, model.today_idle_charged_us = totals.wait_us, totals.idle_charged_us
    return model


def _worker_type(workers: int) -> type:
    """The narrowest integer that holds each batch's worker, 0..workers-1 or -1 (without workers):
    int16 for any plausible count (loaders.MAX_RECORDED_WORKERS), where int64 was 24 MB at 3M
    batches, held through the assessment. Nothing computes with the ids beyond comparing them
    and indexing by them, so no arithmetic can overflow the narrow type."""
    return np.int16 if workers <= np.iinfo(np.int16).max else np.int64


def _not_measured(n: int) -> np.ndarray:
    """NaN for each of n batches, as a read-only view of one value: a measure per batch that
    the trial lacks (the fetches' CPU time, run queue and hand-over, without the collector's
    fetch events) costs no memory, where an array of NaN was 24 MB at 3M GetNexts, and three
    of them were alive at the assessment's peak."""
    return np.broadcast_to(np.float64(np.nan), (n,))


# Iterators needed to tell a start's compute cost from noise (a median per batch position).
MIN_STARTS_FOR_COMPUTE = 3


def _startup_compute(compute, segment, index, recreated, startup_rows) -> float:
    """Per start of new workers: the first half of an iterator's compute (its `startup_rows`)
    beyond its second half's, by batch position, as the median over the iterators that started
    workers."""
    if recreated.sum() < MIN_STARTS_FOR_COMPUTE:
        return 0.0
    fresh = recreated[segment]
    early = index < startup_rows[segment]  # (0 rows where no workers started)
    steady = compute[fresh & ~early]
    if not len(steady) or not early.any():
        return 0.0
    by_position = pd.Series(compute[early]).groupby(index[early]).median()
    return float(np.maximum(by_position.to_numpy() - np.median(steady), 0.0).sum())


def _startup_rows(segment, recreated, segments) -> np.ndarray:
    """Per segment, its first batches (by number) whose compute _startup_compute counts: the
    first half of each iterator that started workers, where there are enough such to count."""
    if recreated.sum() < MIN_STARTS_FOR_COMPUTE:
        return np.zeros(segments, dtype=np.int64)
    return np.where(recreated, np.bincount(segment, minlength=segments) // 2, 0)


# Steps needed on each side (after a long wait, after the other waits) to tell their compute
# apart: a median's standard error from its absolute deviation is an asymptotic one. Of a large
# loader, IDLE_SAMPLE steps drawn at random are read (a median's noise at that size is far
# below the effect; at random, not by a stride, which can fall in step with the waits' period:
# a slow worker's every 4th batch).
MIN_IDLE_STEPS = 20
IDLE_SAMPLE = 100_000
# One-sided, as SLOW_WORKER_P_VALUE (budget): the compute after a wait is slower, not faster.
IDLE_P_VALUE = 0.01
# ...and large enough to matter: of 100,000 steps a shift of tens of us is told from noise, and
# charged over millions of steps it would be seconds. The slow_worker job's: 14-50 % of its step.
IDLE_MIN_SHARE = 0.05


def _idle_compute(compute, wait, index, segment, workers, startup_rows, delivery,
                  mean_compute) -> tuple[float, float]:
    """How much longer the training loop's step after a long wait (longer than its mean step)
    ran than its other steps (us), where that is told from noise (one-sided test of the
    medians' difference against its standard error, each median's from its absolute deviation)
    and is at least IDLE_MIN_SHARE of a step (and READY_SLACK_US), else 0; and the median of
    those waits. The steps of each iterator's first round and those _startup_compute counts
    are left out (_idle_steps), and its last (its compute is an estimate: see build).

    While the training loop sleeps in next(), its core idles or runs something else, and the
    step after it runs on cold caches. The slow_worker job (a 100 ms wait every 4 batches, the
    others stored): the step after the wait took 1.5-6 ms longer quiet than the steps between
    (6-10 ms), 1-4 ms longer with two `yes`; with its workers alike (waits of 1-30 ms) the
    re-runs' steps after a wait were as long as the rest. The replay takes off each step what
    today's wait cost it and charges what its replayed wait costs: this in proportion to the
    wait up to the median long wait, in full beyond (_idle_charged; the job's steps after waits
    of 10-30 ms ran as the rest, so a 100 ms threshold would do as well there). Left out, the
    prediction of that job with its worker fixed kept 0.05-0.15 s of compute its re-runs did
    not spend. (Its replayed waits are not calibrated as the wait is: where today's replay
    falls short of today's long waits, it charges them less than they cost.)

    (A step that is slower for what its batch holds, a longer sequence that is also slower to
    load, would show here too, and no change of the loader spares that: the test cannot tell
    the two apart.)"""
    n = len(compute)
    last = np.r_[segment[1:] != segment[:-1], True] if n else np.zeros(0, dtype=bool)
    if n > IDLE_SAMPLE:  # (without replacement, which would shrink the medians' error; seeded)
        rows = np.flatnonzero(np.random.default_rng(0).random(n, dtype=np.float32) < IDLE_SAMPLE / n)
        compute, wait, index, segment, last = compute[rows], wait[rows], index[rows], segment[rows], last[rows]
    steps = _idle_steps(index, segment, workers, startup_rows) & ~last
    long = steps & (wait > max(delivery + READY_SLACK_US, mean_compute))
    after_wait, after_other = compute[long], compute[steps & ~long]
    if min(len(after_wait), len(after_other)) < MIN_IDLE_STEPS:
        return 0.0, 0.0
    # (scipy.special, not scipy.stats: see budget._slow_worker)
    from scipy.special import ndtr

    medians = [float(np.median(side)) for side in (after_wait, after_other)]
    # The median's standard error: sqrt(pi / 2) x sigma / sqrt(n), sigma 1.4826 x the MAD.
    errors = [1.2533 * 1.4826 * float(np.median(np.abs(side - m))) / np.sqrt(len(side))
              for side, m in zip((after_wait, after_other), medians)]
    shift = medians[0] - medians[1]
    error = float(np.hypot(*errors))
    if shift < max(READY_SLACK_US, IDLE_MIN_SHARE * medians[1]) or (
            error > 0 and float(ndtr(-shift / error)) >= IDLE_P_VALUE):
        return 0.0, 0.0
    return shift, float(np.median(wait[long]))


def _idle_steps(index, segment, workers, startup_rows) -> np.ndarray:
    """The steps whose compute may carry idle compute (_idle_compute): each iterator's first
    round left out, and the steps whose compute _startup_compute counts (what persistent
    workers spare after each start: counted once)."""
    return (index >= workers) & (index >= startup_rows[segment])


def _delivery_from_waits(wait: np.ndarray) -> float:
    """The delivery cost from the waits alone: the median of the short ones (within twice
    a low quantile), capped (see DELIVERY_CAP_US). The median, not the low quantile
    itself: the cost varies from batch to batch, and its spread is no one's wait."""
    if not len(wait):
        return 0.0
    low = float(np.quantile(wait, DELIVERY_QUANTILE))
    short = wait[wait <= 2 * low + READY_SLACK_US]
    return min(float(np.median(short)) if len(short) else low, DELIVERY_CAP_US)


@dataclass(frozen=True)
class _DeliveryCosts:
    """What each kind of next() costs beyond its batch's fetch (us; _delivery_by_path)."""
    waited_us: float
    ready_us: float
    stored_us: float
    out_of_order_us: float
    ready_measured: bool  # ready_us is the mean of MIN_RECEIVED or more ready batches

    @classmethod
    def every(cls, cost_us: float) -> _DeliveryCosts:
        """One cost for every next(): where they cannot be told apart."""
        return cls(cost_us, cost_us, cost_us, cost_us, False)


def _delivery_by_path(segment, fetch_end, ask, handover, in_order, delivery, delivery_base) -> _DeliveryCosts:
    """What a next() costs beyond its batch's fetch (us): in order, (waiting for its batch and
    taking it from the result queue, taking it from the queue where it already was when next()
    asked, returning one taken off the queue earlier and stored); out of order, taking its own
    batch off the queue. The means of today's measured hand-overs of each kind: the replay sums
    them, and on a busy host a hand-over's spread is wide (the slow_worker job with two busy
    processes: received ones' median 3.6 ms, mean 4.3 ms; with medians its out-of-order re-runs'
    wait was predicted at 0.20-0.25 of training against 0.28-0.36 measured, with means
    0.26-0.32).

    In order, next() reads the queue only while it waits for the batch first in line: a batch
    that arrives before an earlier one is stored then (`_task_info`), unpickled, its tensors'
    shared memory already mapped. Any other next() takes its batch from the queue itself, and
    rebuilding a tensor's shared memory asks its worker for the file descriptor (torch's
    default `file_descriptor` sharing): a round trip to the worker process, which must get a
    core. The slow_worker job's received next()s took 1.8-2.2 ms quiet and 2.8-6.1 ms with both
    cores kept busy (two `yes`, or its own two busy processes), its stored ones 0.1-0.2 ms
    (medians; means 0.1-1.1 ms). Charging every batch the median of today's ready ones (mostly
    stored there) predicted its out-of-order re-runs' wait at 0.07-0.17 of training on the busy
    host, where they measured 0.28-0.36 (quiet, the waits it leaves out are small).
    A batch is stored when its fetch ended before that of an earlier batch of its iterator
    (the queue is first in, first out); out of order none is.

    The out-of-order cost, where every next() takes its own batch off the queue: in order,
    the mean hand-over of the received batches whose fetch ended after their next() had asked.
    A received batch that was ready at the ask pays also for the later batches queued ahead of
    it, which it takes off and stores (their own next() then costs the stored path's 0.2 ms);
    one that ended while next() waited pays its own receive alone (the batches ahead of it were
    taken off during the wait). The slow_worker job with its delay partly hidden and two busy
    processes beside it (12 quiet runs): ready received 6.2-18.4 ms mean, waited received
    2.4-4.9 ms, its 12 out-of-order re-runs' next()s 3.2-4.2 ms; with the mean of all received
    (3.7-7.4 ms) one run of 8 predicted out of order 0.39 s slower, where its re-runs trained
    1.1 s faster. Where fewer than MIN_RECEIVED received batches were waited for, their
    mean is no measure (or there is none: every batch was there before it was asked for). A run
    of that job whose main process computed slower had 3 waited for, one of them 15.6 ms, a mean
    of 6.1 ms where the out-of-order runs just before and after it took 2.7 and 3.5 ms; it
    predicted out of order 0.4 s slower than its 5.7 s, they trained 4.7 and 4.6 s. There the
    received batches' hand-over per batch they took off the queue is taken (that run: 2.3 ms).
    Either is a noisy measure of the cost out of order: 13 in-order runs of that job (3 with its
    workers alike) against the means of their neighbours' out-of-order runs (2.1-3.1 ms) were
    -33 % to +53 % off (the hand-over of received batches per batch each took off the queue,
    waiting or not, no better: -37 % to +60 %); the host's speed moves from run to run. Out of
    order today, every batch is received: their mean.

    In order, a next() that waited for its batch is woken when it arrives, and its worker's queue
    thread was woken first to send it; one whose batch was already in the queue waits for
    neither (but takes off and stores any later batches queued ahead of it: the hidden job's
    above, 6.2-18.4 ms). The slow_worker job with its workers made alike (12 runs quiet, 8 with
    both cores kept busy): the next()s whose batch was there took 1.1-1.7 ms quiet (2.7 and 3.6
    ms in two runs on a busier moment) and 2.6-3.5 ms busy (means), those that waited 2.2-3.5 ms
    quiet, the stored ones 0.1 ms quiet and 0.7-1.1 ms busy. The replay charges each the mean of
    its kind (of the received ones, where fewer than MIN_RECEIVED waited). The planted job
    (worker 1 4x slower) receives only batches it waited for, every other worker's being stored
    meanwhile: where fewer than MIN_RECEIVED received batches were there at the ask, their cost
    is taken halfway between the stored and the waited-for path (its 20 runs: 1.2-1.8 ms quiet,
    3.5 ms on the busier moment, 1.9-2.9 ms busy). Charged the waited-for cost
    (2.3-6.8 ms), as once, each next() of that job with its worker fixed, the finding's
    prediction of it overshot its re-runs' training by 26-29 % (group means, quiet) here, and by 68 %
    in a CI run whose planted run met a busier host.

    Last, whether the cost of a next() whose batch was there is measured (MIN_RECEIVED of them),
    not the midpoint: the hand-over the budget names (PipelineModel.handoff_us). The delivery
    cost, the median of every batch there at the ask, flips with the share of them stored: the
    cpu job with two `yes` running, 4 planted runs, gave 0.15, 5.7, 5.3 and 9.4 ms of hand-over
    (their stored batches 46, 37, 36 and 23 of 63-65), the same job with cheaper samples 4.6-7.2
    ms (stored 6-11 of 116-119): no shorter. The received ones' mean: 19-38 ms against 8.8-9.8 ms."""
    if in_order:
        ends = pd.Series(fetch_end)
        earlier = ends.groupby(segment).cummax().groupby(segment).shift(1).to_numpy(dtype=np.float64)
        stored = np.isfinite(fetch_end) & (fetch_end < earlier)
    else:
        stored = np.zeros(len(fetch_end), dtype=bool)
    measured = np.isfinite(handover)
    received = measured & ~stored
    waited_for = received & (fetch_end > ask)
    there = received & ~waited_for
    received_mean = _mean(handover[received])
    stored_cost = _mean(handover[measured & stored])
    stored_cost = stored_cost if stored_cost is not None else delivery_base
    if np.count_nonzero(waited_for) >= MIN_RECEIVED:
        waited = _mean(handover[waited_for])
    else:
        waited = received_mean if received_mean is not None else delivery
    if not in_order:  # every batch is received: their mean
        out_of_order = received_mean if received_mean is not None else delivery
    elif np.count_nonzero(waited_for) >= MIN_RECEIVED or received_mean is None:
        out_of_order = waited
    else:
        # Too few to average (a heavy tail): the received ones' hand-over per batch they took
        # off the queue, theirs and the stored ones (a main process slower than its workers
        # receives nearly every batch in a next() whose batch was there).
        out_of_order = float(np.sum(handover[received])) / np.count_nonzero(measured)
    ready_measured = np.count_nonzero(there) >= MIN_RECEIVED
    ready = _mean(handover[there]) if ready_measured else (stored_cost + waited) / 2
    return _DeliveryCosts(waited, ready, stored_cost, out_of_order, bool(ready_measured))


def _inferred_service(segment, index, worker, ask, ret, wait, delivery, workers, prefetch, first_ask,
                      recreated):
    """Service times and start-ups from the main process's records alone (see the module)."""
    n = len(wait)
    ready_known = wait > delivery + READY_SLACK_US
    ready = np.where(ready_known, ret - delivery, np.nan)

    def same_back(k: int) -> np.ndarray:
        """Whether the batch k places earlier is of the same iterator's same epoch (k >= 1)."""
        same = np.zeros(n, dtype=bool)
        if k < n:
            same[k:] = (segment[:n - k] == segment[k:]) & (index[k:] >= k)
        return same

    def back(values: np.ndarray, k: int, same: np.ndarray, otherwise: np.ndarray) -> np.ndarray:
        """`otherwise` (an array of its own) with the value of the batch k places earlier
        where `same` (never in the first k)."""
        if k < n:
            np.copyto(otherwise[k:], values[:n - k], where=same[k:])
        return otherwise

    # In place, each array let go once read, and shifted as slices, not gathered: an array of
    # the batches is 24 MB at 3M GetNexts, and those held here were the assessment's peak.
    # sent at the return of the batch `prefetch` places earlier (primed at the start)
    has_sender = same_back(prefetch)
    sent = back(ret, prefetch, has_sender, first_ask[segment])
    has_previous = same_back(workers)
    previous_ready = back(ready, workers, has_previous, np.full(n, np.nan))
    service = np.fmax(sent, previous_ready, out=sent)
    np.subtract(ready, service, out=service)
    del sent, has_sender
    service[~(ready_known & has_previous & np.isfinite(previous_ready))] = np.nan
    del has_previous, previous_ready
    service[~(service > 0)] = np.nan
    startup = np.zeros((len(first_ask), workers))
    med_all = _median(service)
    first_round = index < workers
    for w in range(workers):
        mine = first_round & (worker == w) & ready_known
        med = _median(service[worker == w]) or med_all or 0.0
        seg = segment[mine]
        startup[seg, w] = np.where(recreated[seg], np.maximum(ready[mine] - first_ask[seg] - med, 0.0), 0.0)
    return service, startup


def _fill_unwaited_service(service, worker, workers, compute, delivery, overall) -> None:
    """Fills in the service of workers whose batches were never waited for.

    Under in-order delivery alike workers leave the waits on the worker first in line
    (worker 0: each epoch starts the cycle there); the ones behind it are as fast, their
    batches merely ready. Waits on other workers and none on worker 0 mean those workers
    are slower: the ones never waited for are then taken to be just fast enough to keep
    up with the main process (num_workers x (compute + delivery)), no faster (an estimate
    that does not over-promise what out-of-order delivery would give)."""
    known = [bool(np.isfinite(service[worker == w]).any()) for w in range(workers)]
    if known[0] or not any(known):
        return
    just_enough = workers * (float(np.median(compute)) + delivery) if len(compute) else overall
    fast = min(overall, just_enough)
    for w in range(workers):
        if not known[w]:
            service[worker == w] = fast


def _sample(segment: np.ndarray, segments: int) -> tuple[np.ndarray, float, int, np.ndarray]:
    """What to replay: the segments (all, or an even sample), the scale from their batches to
    all, how many of each one's first batches (the cap), and each one's batches beyond it. At
    most about MAX_REPLAY_BATCHES batches: a few long iterators (10 epochs of 300,000 batches)
    are replayed on their first batches, not whole (0.55 s a replay at 3M batches)."""
    n = len(segment)
    if n <= MAX_REPLAY_BATCHES:
        return np.arange(segments), 1.0, n, np.zeros(segments, dtype=np.int64)
    sizes = np.bincount(segment, minlength=segments)
    keep = max(1, int(segments * MAX_REPLAY_BATCHES / n))
    chosen = np.unique(np.linspace(0, segments - 1, keep).round().astype(np.int64))
    chosen = np.union1d(chosen, [0])  # the first: it starts the workers
    cap = max(1, MAX_REPLAY_BATCHES // len(chosen))
    return chosen, n / max(int(sizes[chosen].sum()), 1), cap, np.maximum(sizes[chosen] - cap, 0)


def _replay_bounds(model: PipelineModel) -> tuple[np.ndarray, np.ndarray]:
    """Per replayed segment, the positions of its first and past its last replayed batch."""
    starts = np.searchsorted(model.segment, model.replay_segments, side="left")
    stops = np.searchsorted(model.segment, model.replay_segments, side="right")
    return starts, np.minimum(stops, starts + model.replay_cap)


def busy_workers(service_us: np.ndarray, training_us: float) -> float:
    """How many workers were fetching at once, on average over the training time: their
    service time (worker-seconds) per second of training."""
    return float(np.sum(service_us)) / max(float(training_us), 1.0)


def replayed_rows(model: PipelineModel) -> np.ndarray:
    """The batches the replay runs (a mask over the model's batches): its segments' first
    `replay_cap` each."""
    starts, stops = _replay_bounds(model)
    lengths = stops - starts
    rows = np.repeat(starts - np.cumsum(np.r_[0, lengths[:-1]]), lengths) + np.arange(int(lengths.sum()))
    mask = np.zeros(len(model.segment), dtype=bool)
    mask[rows] = True
    return mask


# --- the replay -----------------------------------------------------------------------------

def _idle_charged(idle, k: int, wait: float) -> float:
    """The idle compute (_idle_compute) the step after the k-th next() pays for its wait: in
    proportion to it, in full from the median long wait on. `idle`: per step, the idle compute
    (0 for a step it does not apply to), and that median."""
    excess, full_at = idle[0][k], idle[1]
    return excess * (wait / full_at if wait < full_at else 1.0) if excess else 0.0


def _replay_in_order(cost, compute, ready_at, speed, workers, prefetch, delivery, first, idle):
    waited, ready, stored = delivery
    free = list(ready_at)
    returned = []
    waits, charged = [], []
    now = 0.0
    latest = -np.inf  # the latest fetch end so far: a batch done before it was stored
    for b, (c, comp) in enumerate(zip(cost, compute)):
        w = (first + b) % workers
        sent = returned[b - prefetch] if b >= prefetch else 0.0
        start = free[w] if free[w] > sent else sent
        done = start + c * speed[w]
        free[w] = done
        if done < latest:
            back = now + stored
        elif done > now:
            back = done + waited
        else:
            back = now + ready
        if done > latest:
            latest = done
        waits.append(back - now)
        returned.append(back)
        if idle is not None:
            charged.append(_idle_charged(idle, b, back - now))
            comp += charged[-1]
        now = back + comp
    return waits, charged


def _replay_any_order(cost, compute, ready_at, speed, workers, prefetch, delivery, _first, idle):
    # (`_first`: the in-order replay's signature; out of order a batch goes to whichever worker
    # has room, not by its number, and none waits in the store: every next() pays the one cost
    # out of order, see _delivery_by_path)
    received = delivery[0]
    free = list(ready_at)
    outstanding = [0] * workers
    cap = max(1, prefetch // workers)
    pending: list[tuple[float, int]] = []
    state = {"sent": 0, "cycle": 0}
    n = len(cost)

    def send(at: float) -> None:
        if state["sent"] >= n:
            return
        for _ in range(workers):
            w = state["cycle"]
            state["cycle"] = (w + 1) % workers
            if outstanding[w] < cap:
                break
        else:
            return
        start = free[w] if free[w] > at else at
        done = start + cost[state["sent"]] * speed[w]
        free[w] = done
        outstanding[w] += 1
        state["sent"] += 1
        heapq.heappush(pending, (done, w))

    for _ in range(min(prefetch, n)):
        send(0.0)
    now = 0.0
    waits, charged = [], []
    for k, comp in enumerate(compute):  # the k-th next() returns whatever arrived first
        if not pending:
            break
        done, w = heapq.heappop(pending)
        back = (done if done > now else now) + received  # out of order nothing is stored
        waits.append(back - now)
        outstanding[w] -= 1
        send(back)
        if idle is not None:
            charged.append(_idle_charged(idle, k, back - now))
            comp += charged[-1]
        now = back + comp
    return waits, charged


@dataclass(frozen=True)
class Replayed:
    """A replay's totals over all of the loader's batches (us)."""
    wait_us: float
    idle_charged_us: float  # the idle compute it charges the steps after its waits (_idle_compute)


def replay(model: PipelineModel, settings: Settings) -> Replayed:
    """The model's total wait over all of the loader's batches under `settings`, and the idle
    compute its waits cost."""
    return _totals(model, _replay(model, settings))


def _totals(model: PipelineModel, segments: list[tuple[int, np.ndarray, np.ndarray]]) -> Replayed:
    return Replayed(_total(model, [(seg, waits) for seg, waits, _ in segments]),
                    _total(model, [(seg, charged) for seg, _, charged in segments]))


def _total(model: PipelineModel, per_segment: list[tuple[int, np.ndarray]]) -> float:
    """All batches' total of a per-next() measure of the replayed segments (their batches beyond
    the cap as their second half's mean, the segments not replayed by the scale)."""
    total = 0.0
    for (_, w), beyond in zip(per_segment, model.replay_beyond.tolist()):
        total += float(np.sum(w)) + (beyond * float(np.mean(w[len(w) // 2:])) if beyond and len(w) else 0.0)
    return total * model.replay_scale


def _replay(model: PipelineModel, settings: Settings) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per replayed segment, each next()'s wait under `settings` (in delivery order; in order
    that is the batch order), and the idle compute that wait costs the step after it (empty
    where the model has none: _idle_compute)."""
    workers = settings.num_workers
    sigma = model.cpu_stretch(max(workers, 1))
    cost_all = model.latency_base_us + model.cpu_base_us * sigma
    if not model.settings.num_workers:
        delivery = (DEFAULT_DELIVERY_US,) * 3
    elif settings.in_order:
        delivery = (model.waited_us, model.ready_us, model.stored_us)
    else:
        delivery = (model.out_of_order_us,) * 3
    speed = [float(model.speed[w]) if w < len(model.speed) else 1.0 for w in range(workers)]
    starts, stops = _replay_bounds(model)
    first_start = model.startup_us[0] if len(model.startup_us) else np.zeros(1)
    out = []
    for seg, lo, hi in zip(model.replay_segments.tolist(), starts.tolist(), stops.tolist()):
        cost = cost_all[lo:hi]
        compute, idle, paid = model.compute_us[lo:hi], None, np.zeros(0)
        if model.idle_compute_us > 0:
            # Each step's compute without the idle compute today's wait cost it; the replay charges
            # it back for the replayed wait.
            excess = np.where(_idle_steps(model.index[lo:hi], model.segment[lo:hi], model.settings.num_workers,
                                          model.startup_rows), model.idle_compute_us, 0.0)
            idle = (excess.tolist(), model.idle_full_wait_us)
            paid = np.array([_idle_charged(idle, k, wait) for k, wait in enumerate(model.wait_us[lo:hi].tolist())])
            compute = np.maximum(compute - paid, 0.0)
        if workers == 0:
            # The training process loads each batch itself: it never idles in next(), and the model
            # knows nothing of what its own loading costs its steps. Today's charge stays.
            out.append((seg, cost.copy(), paid))
            continue
        first = int(model.index[lo])  # (not 0 where the recording began mid-epoch: rounds.py)
        fresh = (seg == 0 or not settings.persistent_workers) and first == 0
        today = model.startup_us[seg] if model.recreated[seg] else first_start
        ready = today if fresh else np.zeros_like(today)
        if not model.settings.num_workers:
            ready = np.zeros(1)
        ready_at = ready.tolist()[:workers]
        if workers > len(ready_at):  # new workers start as today's do, on the median
            ready_at += [float(np.median(ready)) if len(ready) else 0.0] * (workers - len(ready_at))
        run = _replay_in_order if settings.in_order else _replay_any_order
        waits, charged = run(cost.tolist(), compute.tolist(), ready_at, speed, workers,
                             workers * settings.prefetch_factor, delivery, first, idle)
        out.append((seg, np.asarray(waits), np.asarray(charged)))
    return out
