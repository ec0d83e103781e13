"""The wait budget: where every second a loader's GetNexts waited went.

Parts, per training loader (they add up to its measured wait, by construction):
- main_process: a loader without workers (num_workers=0) loads inside next(): all of it;
- startup: the first round of each iterator (one batch per worker): what it waited
  beyond the steady wait of those workers' batches (starting processes, opening the
  dataset in each, filling the pipeline); and, where the trial records it (Kineto), the
  next() that ends the epoch (shutting the workers down);
- tail: steady batches that waited far beyond their worker's steady wait (single slow
  samples or batches): their excess over it; where the collector recorded the fetches,
  only batches whose own fetch was slow, and not from queueing for a core (contention
  stays in throughput); without fetch times, only batches beyond the spread of their
  worker's waits too (TAIL_SPREAD_DEVIATIONS);
- imbalance: a slow worker under in-order delivery: the steady wait on its batches
  beyond what the other workers' batches wait;
- contention: where the collector recorded the fetches, on a host whose cores other
  processes held: the hand-over of throughput's batches (from the end of a batch's fetch,
  or the ask if later, to next()'s return) beyond an uncontended one, less the share the
  workers' own sample work holds it up (see _contention). Passing a batch needs
  its worker's threads (the result queue's feeder; the resource sharer that hands each
  tensor's file descriptor to the training process) and the training process to get a
  core: on a host kept busy by others they queue for one, whatever the DataLoader's settings;
- throughput: the rest of the steady wait: the workers not keeping up with the compute
  (from too few workers or from saturated CPUs: `bound` and the evidence say which), and
  the delivery cost every batch pays;
- residual: the steady wait that the pipeline model, replayed with the loader's own
  service and compute times, does not produce, beyond what the collector measured of it: the
  hand-overs beyond the replay's median one (the delivery the batches paid, throughput's) and
  the contention. It is taken out of throughput, reported, never hidden.

The "steady wait" of a worker's batches is the median wait of its batches after the first
round. Waits under in-order delivery land unevenly even on alike workers (the batch first
in line each round waits, the ones behind it are ready), so a worker is called slow only
on its service times (the collector's fetch events), or, without them, when the waits
land on a worker that is not first in line, which the pairing effect never does, by more
than what the host's other load can put there (SLOW_WORKER_SPREAD_FACTOR), or when the
tail's stalls pile on it beyond chance.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .loaders import Loader, ProcessTraining, merge
from .pipeline import READY_SLACK_US, PipelineModel, busy_workers, replayed_rows

PARTS = ("startup", "throughput", "imbalance", "tail", "main_process", "contention", "residual")
# A steady batch is a tail batch when it waits this many times its worker's steady wait,
# and at least TAIL_MIN_US more: the reference's outlier rule (2x the median), with a floor
# so that sub-millisecond jitter on ready batches is not a "slow sample".
TAIL_FACTOR = 2.0
TAIL_MIN_US = 2_000.0
# Without fetch times to say the batch's own fetch was slow, a tail batch must also lie beyond
# the spread of its worker's steady waits: more than this many robust standard deviations
# (1.4826 x the median absolute deviation) above their median (Hampel's identifier). A worker a
# little too slow for the loop waits a little more or less each round, and 2x its median is
# inside that spread: 2-worker torch.profiler recordings of 25 batches with worker 1 10-25 %
# too slow, two `yes` on the 2 cores, had 2.2-8.8 ms waits taken for slow samples in 8 runs of
# 20, 3 with this rule (the worker's waits 0.5-5.3 ms, median 1.2, limit 6.6 ms, in the one
# kept in tests/recordings/). The median and its deviation stand while fewer than half of the
# batches are slow: Tukey's fence (the third quartile plus 3 interquartile ranges) rose above
# the slow batches where a quarter of a worker's were (a shard of slow files, the same slow
# sample each epoch), and above any batch of a worker with 4 steady batches or fewer. (On the
# waits' logarithms the limit is a multiple of the median: 56 ms on that recording, hiding a
# 40 ms sample. With 3 deviations, its 4.8 and 5.3 ms waits passed; 5 leaves them inside.)
# Where more than half of a worker's waits are equal (a coarse timer) the deviation is 0 and
# the rule above decides.
TAIL_SPREAD_DEVIATIONS = 5.0
# A worker is slow when its median service time is this many times the other workers'
# (fetch events), or, without them, when its batches' steady wait is this many times the
# others' (plus slack), it is not first in line, and it leads the others by more than
# SLOW_WORKER_SPREAD_FACTOR allows. Alike workers read within 1.3x of one another on the
# collector's fetch times in the scenario runs; 2x leaves room for noise.
SLOW_WORKER_FACTOR = 2.0
SLOW_WORKER_WAIT_FACTOR = 4.0
# Tail batches concentrated on one worker beyond chance (binomial, Bonferroni over the
# workers) make it a slow worker too (a shard of slow files, a sampler that skews).
SLOW_WORKER_P_VALUE = 0.01
MIN_TAIL_FOR_TEST = 3
# Without fetch times, a worker whose batches come late by less than this many times the
# spread (interquartile range) of the main process's own compute per batch is not named slow
# for it (stalls piling on it, below, still can: no recording here showed those from load).
# Where the loop does the same work every batch, that spread is what other load on the host
# adds, and on a busy host alike workers' batches come late on one worker too, the same one
# round after round. Measured on 2-worker torch.profiler recordings of 25 batches (the late
# worker's lead over the other's steady wait, over the spread): alike workers with four `yes`
# on the 2 cores 0.0-3.2 in 8 of the 9 runs in 60 that got a worker count (two of them a wrong
# count of 4: rounds.PERIOD_MIN_STALLS); the one at 1.7, 3.9 ms against a 2.3 ms spread, was
# named slow before this rule; the ninth, a wrong count of 5, 29.5, named no finding. A worker
# 10-25 % slower than the loop needs, with two `yes`: 5.4-35 in the 11 runs of 20 that named
# it (the same 11 before and after); 2x slower (30 ms a sample): 136-668. A limit of what a
# trace without fetch times can tell: where the loop's compute varies by itself (batches of
# varied length), its spread is the job's, and a slow worker that leads by less than 4x it is
# not named (synthetic steps of 5-45 ms, a 14 ms spread: workers 10x and 40x slow, 9 and 40 ms
# ahead, got more_workers, whose replay models the slow worker's service; 60x is named).
# Capping the bar at a median compute would name alike workers on a busy host again wherever
# the loop's compute is short.
SLOW_WORKER_SPREAD_FACTOR = 4.0
# CPU use over the cores at which the host counts as saturated: schedulers and monitoring
# rarely let a busy host read higher.
CPU_SATURATED_PERCENT = 90.0
# ...as it does when the cores left free could not hold another computing worker: less than
# half a core. The cpu scenario (2 computing workers and the training process on 2 cores)
# read 87-90 % busy over its training, 0.2-0.26 cores free; doubling its workers gained 3-5 %
# there (quiet), and the model predicted 7 %: at 87 % the flat bar took the host for one with
# room, and the finding told the user to raise num_workers.
MIN_FREE_CORES = 0.5


def cores_saturated(util: float | None, cores: int | None) -> bool:
    """Whether the host's CPUs were full in training (util: percent of all its cores)."""
    if util is None:
        return False
    return util >= CPU_SATURATED_PERCENT or (bool(cores) and cores * (1.0 - util / 100.0) < MIN_FREE_CORES)


# An uncontended hand-over is the one batches that found a core at once got. On a host other
# processes keep busy the hand-overs fall in two modes: those that found a core at once, and
# those that queued for one. The contention job (clean's, beside two busy processes, 2 cores)
# handed over 1.1-2.3 ms a batch in the first, 4-7 ms (medians) in the second, and 10-50 % of
# its batches were in the first. The uncontended one is the first mode's median: that of the
# hand-overs at most FIRST_MODE_SPAN times this low quantile, which lies in the first mode
# while at least that share of the batches does (not below delivery itself). A fixed quantile
# fell between the modes: at the 25 % quantile, a run with only 10-25 % of its batches in the
# first mode took 3.5 ms for uncontended (its first mode's median: 1.6 ms) and counted 0.44 s
# of contention instead of 0.64 s, and the rest went to throughput, 0.51 s, which then looked the
# larger cause (a CI failure). On the runs where that quantile was in the first mode, the two agree
# within 0.03 s (14 runs). The hand-overs are never negative (pipeline.build clips them), so the
# first mode holds at least the quantile's batches. Against the
# waiting that the busy processes' removal removed, the part was 0.94-1.23x in 8 pairs at the
# 25 % quantile and 0.93-1.23x in 16 more pairs with this median.
# On a saturated host few batches find a core at once, so this holds some queueing, and the
# part claims less, never more.
FIRST_MODE_QUANTILE = 0.1
# The first mode's width: its 25 % quantile was 1.2-1.45x its 5 %, the second mode's median
# 2.5x and more its 10 % quantile. At 1.5 instead of 2 the 14 runs' parts moved by at most 0.012 s.
FIRST_MODE_SPAN = 2.0
# A worker whose fetches use the CPU for less than this share of their time mostly waits
# (storage, network, locks): latency-bound.
LATENCY_CPU_SHARE = 0.5


@dataclass
class LoaderBudget:
    node: str  # the host
    process: str  # the process id on it (trial/frames.py)
    loader: str  # the iterator class and its worker count, as the findings name it
    training_s: float
    wait_s: float
    parts: dict  # PARTS -> seconds
    bound: str  # latency | cpu | unknown
    evidence: dict = field(default_factory=dict)
    slow_worker: int | None = None
    windows: dict = field(default_factory=dict)  # part -> [(start_us, end_us), ...] to show it
    tail_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # the tail's batches
    iterator: str = ""  # the loader's iterator class (Loader.name), which `loader` also names

    @property
    def largest(self) -> str:
        return max(PARTS, key=lambda p: self.parts[p])


def loader_training_us(process: ProcessTraining, loader: Loader) -> int:
    """The loader's share of the node's training windows: those of its iterators."""
    mine = loader.calls["segment"].unique()
    lo, hi = process.segment_windows.loc[mine, "lo"].to_numpy(), process.segment_windows.loc[mine, "hi"].to_numpy()
    starts, ends = merge(lo, hi)
    return int(np.sum(ends - starts))


def _per_worker_median(values: np.ndarray, worker: np.ndarray, mask: np.ndarray, workers: int) -> np.ndarray:
    out = np.full(workers, np.nan)
    for w in range(workers):
        mine = values[mask & (worker == w)]
        if len(mine):
            out[w] = np.median(mine)
    if np.isfinite(out).all():
        return out
    # (Only for a worker without values: the median of all of them copied 3M batches twice.)
    fallback = np.median(values[mask]) if mask.any() else (np.median(values) if len(values) else 0.0)
    return np.where(np.isfinite(out), out, fallback)


def _slow_worker(model: PipelineModel, base: np.ndarray, tail_mask: np.ndarray) -> tuple[int | None, dict]:
    workers = model.settings.num_workers
    if workers < 2:
        return None, {}
    worker = model.worker
    evidence: dict = {}
    if model.service_measured:
        medians = np.array([np.median(model.service_us[worker == w]) if (worker == w).any() else np.nan
                            for w in range(workers)])
        k = int(np.nanargmax(medians))
        others = float(np.nanmedian(np.delete(medians, k)))
        evidence = {"fetch_median_s": round(float(medians[k]) / 1e6, 6),
                    "others_fetch_median_s": round(others / 1e6, 6)}
        if medians[k] >= SLOW_WORKER_FACTOR * max(others, 1.0):
            return k, evidence
    else:
        k = int(np.argmax(base))
        others = float(np.max(np.delete(base, k)))
        first_in_line = k == 0  # each epoch starts the cycle at worker 0 (torch's _reset)
        floor = max(others, model.delivery_us + READY_SLACK_US)
        spread = _compute_spread_us(model)
        evidence["compute_spread_s"] = round(spread / 1e6, 6)
        if (not first_in_line and base[k] >= SLOW_WORKER_WAIT_FACTOR * floor
                and base[k] - others >= SLOW_WORKER_SPREAD_FACTOR * spread):
            return k, evidence
    # Tail batches piling up on one worker.
    stalls = worker[tail_mask]
    if len(stalls) >= MIN_TAIL_FOR_TEST:
        # scipy.special's binomial tail, not scipy.stats.binom: the same function, and importing
        # scipy.stats cost 0.54 s of every `analyze` process (scipy.special 0.13-0.18 s, imported
        # here: only a loader with a long enough tail of stalls tests it).
        from scipy.special import bdtrc

        counts = np.bincount(stalls[stalls >= 0], minlength=workers)
        k = int(np.argmax(counts))
        p_value = float(min(1.0, workers * bdtrc(counts[k] - 1, len(stalls), 1.0 / workers)))
        evidence.update({"stalls_on_worker": int(counts[k]), "stalls_total": int(len(stalls)),
                         "p_value": float(f"{p_value:.3g}")})
        if p_value < SLOW_WORKER_P_VALUE and model.service_measured is False:
            return k, evidence
        if p_value < SLOW_WORKER_P_VALUE and model.service_measured:
            # Measured fetch times decide: slow samples that land on one worker by index
            # (round-robin) are not the worker's fault unless its fetches are slower.
            return None, evidence
    return None, evidence


def _beyond_spread(values: np.ndarray, worker: np.ndarray, mask: np.ndarray, medians: np.ndarray) -> np.ndarray:
    """Per worker, its values' median under mask (`medians`, _per_worker_median's) plus
    TAIL_SPREAD_DEVIATIONS robust standard deviations of them (1.4826 x the median absolute
    deviation; none for a worker without values, whose median is the others')."""
    deviation = np.zeros(len(medians))
    for w in range(len(medians)):
        mine = values[mask & (worker == w)]
        if len(mine):
            deviation[w] = np.median(np.abs(mine - medians[w]))
    return medians + TAIL_SPREAD_DEVIATIONS * 1.4826 * deviation


def _compute_spread_us(model: PipelineModel) -> float:
    """The interquartile range of the main process's compute per batch (SLOW_WORKER_SPREAD_FACTOR)."""
    if not len(model.compute_us):
        return 0.0
    q25, q75 = np.percentile(model.compute_us, [25, 75])
    return float(q75 - q25)


def _slow_fetch(model: PipelineModel) -> np.ndarray:
    """Batches whose own fetch was slow: over TAIL_FACTOR x its worker's median fetch, and
    not mostly from queueing for a core (where the kernel measured it). A long wait for a
    batch that was fetched as fast as the others is the main process's own delay or the
    pipeline's (throughput), not a slow sample; one that queued for a core is contention."""
    service, worker = model.service_us, model.worker
    workers = model.settings.num_workers
    median = np.array([np.median(service[worker == w]) if (worker == w).any() else np.nan
                       for w in range(workers)])[worker]
    slow = service > TAIL_FACTOR * median
    runq = model.runq_us
    if np.isfinite(runq).any():
        typical = np.nanmedian(runq)
        queued = np.nan_to_num(runq - typical, nan=0.0)
        slow &= queued < 0.5 * (service - median)
    return slow


def _bound(model: PipelineModel, process: ProcessTraining, util: float | None) -> tuple[str, bool]:
    """latency | cpu | unknown, and whether it is an estimate."""
    service = float(np.sum(model.service_us))
    if model.settings.num_workers == 0 or service <= 0:
        return "unknown", True
    saturated = cores_saturated(util, process.cores)
    if model.cpu_measured:
        # The fetches' share of time computing or queueing for a core (measured), else
        # computing, with the model's stretch from sharing cores.
        stretch = model.cpu_stretch(model.settings.num_workers)
        share = float(np.sum(model.cpu_base_us * model.speed[model.worker])) * stretch / service
        return ("latency" if share < LATENCY_CPU_SHARE else "cpu"), False
    if util is None or not process.cores:
        return "unknown", True
    if saturated:
        return "cpu", True
    busy = busy_workers(model.service_us, process.training_us)
    used = util / 100.0 * process.cores
    if busy >= 1.0 and used < LATENCY_CPU_SHARE * busy:
        return "latency", True  # busy workers that leave the cores idle are waiting
    return "unknown", True


def budget(process: ProcessTraining, loader: Loader, model: PipelineModel) -> LoaderBudget:
    g = model.wait_us
    wait = float(np.sum(g))
    training_us = loader_training_us(process, loader)
    parts = dict.fromkeys(PARTS, 0.0)
    windows: dict = {}
    util = process.training_cpu_percent
    evidence = {"batches": int(len(g)), "iterators": int(loader.segments),
                "num_workers": loader.num_workers, "prefetch_factor": loader.prefetch_factor,
                "in_order": loader.in_order, "persistent_workers": loader.persistent,
                "delivery_s": round(model.delivery_us / 1e6, 6),
                "handoff_s": round(model.handoff_us / 1e6, 6),
                "median_compute_s": round(float(np.median(model.compute_us)) / 1e6, 6) if len(g) else None,
                "service_measured": model.service_measured, "cpu_percent": None if util is None else round(util, 1),
                "cores": process.cores}
    workers = model.settings.num_workers
    slow = None
    if workers == 0:
        parts["main_process"] = wait
        bound, estimated = "unknown", True
    else:
        worker, index = model.worker, model.index
        first_round = index < workers
        if loader.records_stop_iteration:
            # torch.profiler records the next() that raises StopIteration: the epoch's end,
            # where non-persistent workers are shut down. Start-up's counterpart, not a batch.
            last = np.r_[model.segment[1:] != model.segment[:-1], True]
            first_round = first_round | last
        steady = ~first_round
        base_by_worker = _per_worker_median(g, worker, steady, workers)

        def excess_of(rows: np.ndarray) -> np.ndarray:
            """The waits of the batches `rows` selects beyond their worker's median, or 0."""
            return np.maximum(g[rows] - base_by_worker[worker[rows]], 0.0)

        # Each batch's worker's median and waits beyond it are taken only for the batches a
        # part sums: for all of them they were two arrays of 3M batches (24 MB each), alive at
        # the assessment's peak. A tail batch waits over both TAIL_FACTOR x its worker's median
        # and that median + TAIL_MIN_US.
        tail_mask = steady & (g > np.maximum(TAIL_FACTOR * base_by_worker, base_by_worker + TAIL_MIN_US)[worker])
        if model.service_measured:
            tail_mask &= _slow_fetch(model)
        else:
            tail_mask &= g > _beyond_spread(g, worker, steady, base_by_worker)[worker]
        startup_excess = excess_of(first_round)
        parts["startup"] = float(np.sum(startup_excess))
        parts["tail"] = float(np.sum(excess_of(tail_mask)))
        steady_wait = wait - parts["startup"] - parts["tail"]
        slow, slow_evidence = _slow_worker(model, base_by_worker, tail_mask)
        evidence.update(slow_evidence)
        if slow is not None:
            others = float(np.max(np.delete(base_by_worker, slow)))
            mine = worker == slow
            imbalance = float(np.sum(np.maximum(np.minimum(g[mine], base_by_worker[slow]) - others, 0.0)))
            on_tail = tail_mask & mine  # its stalls, when they are what makes it slow
            if not model.service_measured and "p_value" in slow_evidence:
                tail_mask = tail_mask & ~on_tail
                stalls = float(np.sum(excess_of(on_tail)))
                imbalance += stalls
                parts["tail"] -= stalls
                steady_wait += stalls
            parts["imbalance"] = min(imbalance, steady_wait)
        startup_batches = np.zeros(len(g), dtype=bool)
        startup_batches[first_round] = startup_excess > 0
        throughput = steady_wait - parts["imbalance"]
        # Throughput's batches: steady ones that are neither stalls nor the slow worker's.
        plain = steady & ~tail_mask & (worker != slow if slow is not None else True)
        gil_busy = _worker_gil_busy(model, training_us)
        contention, contended, contention_evidence = _contention(model, process, util, plain, gil_busy)
        evidence.update(contention_evidence)
        parts["contention"] = min(contention, throughput)
        # The replay hands every batch over in the median hand-over, so what it does not produce
        # holds the hand-overs beyond that median, measured (the collector's fetch events): the
        # delivery the batches paid (throughput's), or the contention's queueing. Only what is
        # left beyond them is unexplained. Taken whole, the residual left throughput with nothing
        # and capped the contention (beside two busy processes: residual 0.05-0.31 s, throughput
        # 0-0.20 s; now 0 and 0.20-0.25 s, as the same job's 0.24-0.29 s without them), and on
        # the cpu job, whose ready batches wait for the GIL a worker's next sample holds (median
        # 3-8 ms, mean 1.6-2.7x it), it took 0-0.50 s of a 1 s steady wait (0.50 against
        # throughput's 0.49 once).
        measured = max(parts["contention"], _handover_beyond_delivery(model, plain))
        unexplained = _residual(model, g, throughput, plain) - measured
        throughput -= parts["contention"]
        parts["residual"] = min(max(unexplained, 0.0), throughput)
        parts["throughput"] = throughput - parts["residual"]
        bound, estimated = _bound(model, process, util)
        evidence.update({"steady_wait_s": [round(float(b) / 1e6, 6) for b in base_by_worker],
                         "tail_batches": int(tail_mask.sum()),
                         "service_median_s": round(float(np.median(model.service_us)) / 1e6, 6),
                         # The share of the time a worker was fetching: a finished batch's
                         # hand-over waits for its worker's next sample only that often.
                         "worker_busy": round(_worker_busy(model, training_us), 3),
                         # ...and holding the GIL, which a finished batch's hand-over needs
                         # in its worker: a worker that sleeps on storage holds none of it.
                         "worker_gil_busy": round(gil_busy, 3),
                         # (the stretch of the fetches' CPU work the replay charges today)
                         "stretch": round(model.cpu_stretch(workers), 3),
                         "cores_for_workers": None if model.cores_for_workers is None
                         else round(model.cores_for_workers, 2),
                         "worker_cpu_cores": None if model.worker_cpu_cores is None
                         else round(model.worker_cpu_cores, 2),
                         # (cpu + run-queue wait) / cpu of the fetches, measured: not the
                         # contention part, which is the hand-over's
                         "fetch_cpu_stretch": None if model.contention is None else round(model.contention, 3)})
        windows = _part_windows(loader, startup_batches, tail_mask,
                                worker == slow if slow is not None else None, contended)
    evidence["bound_estimated"] = estimated
    seconds = {k: round(v / 1e6, 6) for k, v in parts.items()}
    # Rounding must not break the sum: the residual takes the rounding.
    seconds["residual"] = round(round(wait / 1e6, 6) - sum(v for k, v in seconds.items() if k != "residual"), 6)
    tail_rows = np.flatnonzero(tail_mask) if workers else np.zeros(0, dtype=np.int64)
    return LoaderBudget(process.host, loader.process, loader.label, round(training_us / 1e6, 6), round(wait / 1e6, 6), seconds,
                        bound, evidence, slow, windows, tail_rows, loader.name)


UNMODELLED_NOTE = "num_workers is not recorded, and the waits show no period that tells it: the pipeline model " \
                  "cannot be replayed"
# A trace that saw no iterator begin: the reason it has no finding (report.no_findings_reason).
UNSEEN_NOTE = ("num_workers is not recorded, and the trial shows no iterator begin (the recording began "
               "mid-epoch), so which batch of its round each one is cannot be told: the waiting is not split "
               "among the workers. Start recording before the epoch's loop (torch.profiler: before "
               "`for batch in loader`), or record with the collector")


def unmodelled_budget(process: ProcessTraining, loader: Loader) -> LoaderBudget:
    """A loader whose worker count the trial does not record (Kineto), nor the stalls of an
    iterator it saw begin tell (rounds.py): its wait is split into the first batch of each
    iterator seen from its start and the rest; no worker can be named. (The first batch of a
    recording begun mid-epoch is no start: the 9th batch of an epoch, a slow worker's, waited
    3.8 ms there, not a start-up.)"""
    calls = loader.calls
    waits = calls["duration_us"].to_numpy(dtype=np.float64)
    firsts = (calls["index"].to_numpy() == 0) & np.isin(calls["segment"].to_numpy(), list(loader.seen_from_start))
    median = float(np.median(waits[~firsts])) if (~firsts).any() else 0.0
    startup = float(np.maximum(waits[firsts] - median, 0.0).sum())
    parts = dict.fromkeys(PARTS, 0.0)
    parts["startup"] = round(startup / 1e6, 6)
    parts["throughput"] = round((loader.wait_us - startup) / 1e6, 6)
    return LoaderBudget(process.host, loader.process, loader.label, round(loader_training_us(process, loader) / 1e6, 6),
                        round(loader.wait_us / 1e6, 6), parts, "unknown",
                        {"batches": int(len(calls)), "iterators": int(loader.segments), "num_workers": None,
                         "note": UNMODELLED_NOTE if loader.seen_from_start else UNSEEN_NOTE,
                         "no_findings_reason": None if loader.seen_from_start else UNSEEN_NOTE},
                        iterator=loader.name)


def _worker_busy(model: PipelineModel, training_us: float) -> float:
    """The share of the time a worker was fetching: a finished batch's hand-over waits for
    its worker's next sample only that often."""
    workers = model.settings.num_workers
    return min(1.0, busy_workers(model.service_us, training_us) / max(workers, 1))


def _worker_gil_busy(model: PipelineModel, training_us: float) -> float:
    """The share of the time a worker's sample work held its GIL: computing, or queued for a
    core while computing (measured per fetch); without CPU times, while fetching at all."""
    busy = _worker_busy(model, training_us)
    if not model.cpu_measured:
        return busy
    service = float(np.sum(model.service_us))
    held = np.nan_to_num(model.cpu_base_us * model.speed[model.worker]) + np.nan_to_num(model.runq_us)
    return busy * min(1.0, float(np.sum(held)) / service) if service > 0 else 0.0


def _contention(model: PipelineModel, process: ProcessTraining, util: float | None, batches: np.ndarray,
                gil_busy: float) -> tuple[float, np.ndarray, dict]:
    """The hand-over that other processes' hold on the cores added to `batches` (us), the
    batches it lengthened, and its evidence.

    Only where the collector measured the fetches (a batch's hand-over is then its wait
    after its fetch ended), on a host whose cores were saturated with at least MIN_FREE_CORES
    of them used by other processes. Of each hand-over, what exceeds an uncontended one (see
    FIRST_MODE_QUANTILE) is queueing: for the GIL, which the worker's next sample
    holds as often as `gil_busy` says (_worker_gil_busy: the workers' own, the cpu_saturated finding's),
    else for a core (the others'). Measured on the scenario jobs: with six `yes` running, the
    latency job's ready batches took 8-17 ms each to be handed over (0.1-0.3 ms quiet), and
    raising its workers from 2 to 4 or 8 left its wait as it was (1.7-2.2 s)."""
    handover = model.handover_us
    measured = batches & np.isfinite(handover)
    if not measured.any() or not cores_saturated(util, process.cores) or model.other_cores < MIN_FREE_CORES:
        return 0.0, np.zeros(len(handover), dtype=bool), {}
    uncontended = max(_first_mode_median(handover[measured]), model.delivery_base_us)
    excess = np.maximum(np.where(measured, handover, 0.0) - uncontended, 0.0)
    others_share = 1.0 - gil_busy
    seconds = _as_all_batches(float(np.sum(excess)) * others_share, batches, measured)
    evidence = {"contention_other_cores": round(model.other_cores, 2),
                "handover_median_s": round(float(np.median(handover[measured])) / 1e6, 6),
                "handover_uncontended_s": round(uncontended / 1e6, 6)}
    return seconds, excess > 0, evidence


def _first_mode_median(handover: np.ndarray) -> float:
    """The median of the hand-overs that found a core at once (see FIRST_MODE_QUANTILE)."""
    low = float(np.quantile(handover, FIRST_MODE_QUANTILE))
    return float(np.median(handover[handover <= FIRST_MODE_SPAN * low]))


def _handover_beyond_delivery(model: PipelineModel, batches: np.ndarray) -> float:
    """What the `batches`' measured hand-overs took beyond the replay's delivery (the median),
    with the batches whose fetch went unmatched paying as the matched ones do (us)."""
    handover = model.handover_us
    measured = batches & np.isfinite(handover)
    if not measured.any():
        return 0.0
    return _as_all_batches(float(np.sum(np.maximum(handover[measured] - model.delivery_us, 0.0))), batches, measured)


def _as_all_batches(total_us: float, batches: np.ndarray, measured: np.ndarray) -> float:
    """A total over the `measured` batches (whose fetch matched a hand-over), for all
    `batches`: those whose fetch went unmatched pay as the matched ones do."""
    return total_us * int(batches.sum()) / int(measured.sum())


def _residual(model: PipelineModel, g: np.ndarray, throughput: float, steady: np.ndarray) -> float:
    """Measured steady waiting that the replay of today's settings does not produce, over
    the batches `steady` names (throughput's), as a share of the throughput part.

    The k-th wait of an iterator is its k-th next(), in the replay as in the trial, in
    order or not; the first round (k < num_workers) is start-up in both."""
    if throughput <= 0 or not len(model.replay_segments):
        return 0.0
    waits = model.today_waits
    chosen = replayed_rows(model)
    steady_chosen = steady & chosen
    if not steady_chosen.any():
        return 0.0
    modelled = np.concatenate([w for _, w in waits]) if waits else np.zeros(0)
    modelled_steady = float(np.sum(modelled[steady[chosen]]))
    measured_steady = float(np.sum(g[steady_chosen]))
    if measured_steady <= 0:
        return 0.0
    share = max(0.0, measured_steady - modelled_steady) / measured_steady
    return min(throughput, share * float(np.sum(g[steady])))


def _part_windows(loader: Loader, first_round, tail_mask, slow_mask, contended, limit: int = 20) -> dict:
    """Where each part shows on the timeline: its longest GetNexts, as windows."""
    calls = loader.calls
    start = calls["start_us"].to_numpy()
    end = calls["end_us"].to_numpy()
    wait = calls["duration_us"].to_numpy()

    def longest(mask):
        count = int(np.count_nonzero(mask))
        if count > limit:
            # The `limit` longest without sorting them all (0.3 s at 3M batches): those above the
            # limit-th longest wait, then the first of those equal to it, as a stable sort has them.
            # (One array of the waits, partitioned in place: this runs at the assessment's peak.)
            values = wait[mask]
            values.partition(count - limit)
            kth = values[count - limit]
            del values
            above = np.flatnonzero(mask & (wait > kth))
            rows = np.sort(np.concatenate([above, np.flatnonzero(mask & (wait == kth))[:limit - len(above)]]))
        else:
            rows = np.flatnonzero(mask)
        rows = rows[np.argsort(-wait[rows], kind="stable")][:limit]
        return [(int(start[r]), int(end[r])) for r in rows]

    out = {"startup": longest(first_round), "tail": longest(tail_mask),
           "throughput": longest(~first_round & ~tail_mask)}
    if slow_mask is not None:
        out["imbalance"] = longest(slow_mask & ~first_round)
    if contended.any():
        out["contention"] = longest(contended)
    return out
