"""Synthetic trials in the reference format, written with the collector's own writer.

Used by the tests (which compute expected numbers themselves from `SyntheticTrial.events`)
and by the benchmark. A trial imitates a training job per host: each epoch a
multi-process train loader is initialised (workers re-spawned, non-persistent), serves
`train_batches` GetNexts round-robin over its workers, each followed by a train step;
then a single-process validation loader serves `val_batches`.

`write_job` writes a distributed job instead: several hosts with several ranks each, one
rank or one host slower than the rest, for the hosts/ranks views and their benchmark.

Standard library only.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from . import format as fmt
from .collector.writer import SystemMetricsWriter, TraceWriter

TRAIN_ITER = "_MultiProcessingDataLoaderIter"
VAL_ITER = "_SingleProcessDataLoaderIter"


@dataclass
class SyntheticEvent:
    kind: str  # init | getnext | worker | step
    node: str
    pid: int
    name: str
    start_us: int
    end_us: int
    worker_id: int | None = None
    num_workers: int | None = None
    pin_memory: bool | None = None
    iterator_class: str = ""
    epoch: int = 0
    rank: int | None = None  # write_job: the training rank of the process

    @property
    def duration_us(self) -> int:
        return self.end_us - self.start_us


@dataclass
class SyntheticTrial:
    folder: str
    events: list[SyntheticEvent] = field(default_factory=list)
    system_samples: int = 0  # metric records written
    framework_files: list[str] = field(default_factory=list)
    system_files: list[str] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[SyntheticEvent]:
        return [e for e in self.events if e.kind == kind]


def write_trial(folder: str, *, hosts: int = 1, epochs: int = 3, train_batches: int = 20,
                num_workers: int = 2, val_batches: int = 5, pin_memory: bool = False,
                slow_batches: dict[tuple[int, int], int] | None = None,
                slow_worker: int | None = None, slow_worker_factor: float = 1.0,
                getnext_us: tuple[int, int] = (800, 1200), step_us: tuple[int, int] = (9_000, 11_000),
                init_us: tuple[int, int] = (40_000, 60_000), system: bool = True,
                system_start_delay_s: float = 0.0, system_interval_s: float = 0.5, cpus: int = 2,
                gpus: int = 0, cpu_percent: float = 50.0, iowait_percent: float = 0.5,
                start_us: int = 1_795_986_600_000_000, rotate_s: float = 60.0, seed: int = 0,
                main_pid: int = 20_000) -> SyntheticTrial:
    """Write a trial under `folder`; returns every event written.

    slow_batches: {(epoch, batch): duration_us} GetNexts that take that long.
    slow_worker: a worker id whose GetNexts are `slow_worker_factor` times slower.
    system_start_delay_s: system metrics begin this long after the first event.
    """
    rng = random.Random(seed)
    slow_batches = slow_batches or {}
    trial = SyntheticTrial(folder)
    end_of_job = start_us
    for host in range(1, hosts + 1):
        pid = main_pid + host
        node = fmt.framework_node_id(pid, host)
        writer = TraceWriter(folder, node, start_time_us=start_us, rotate_s=rotate_s)
        next_worker_pid = pid + 1000

        def emit(kind, phase, name, start, end, args, **extra):
            writer.complete(phase, name, start, end, {fmt.ARG_PID: extra.pop("os_pid", pid), **args})
            trial.events.append(SyntheticEvent(kind, node, extra.pop("event_pid", pid), name, start, end,
                                               **extra))

        t = start_us
        for epoch in range(epochs):
            # train loader: initialisation, then workers live until the epoch's last batch
            init_start, t = t, t + rng.randint(*init_us)
            emit(fmt.KIND_INIT, fmt.PHASE_INIT, fmt.init_event_name(TRAIN_ITER), init_start, t,
                 {fmt.ARG_NUM_WORKERS: num_workers, fmt.ARG_PIN_MEMORY: pin_memory, fmt.ARG_STEP: "-1"},
                 num_workers=num_workers, pin_memory=pin_memory, iterator_class=TRAIN_ITER, epoch=epoch)
            for batch in range(train_batches):
                worker = batch % num_workers if num_workers else -1
                duration = rng.randint(*getnext_us)
                if slow_worker is not None and worker == slow_worker:
                    duration = int(duration * slow_worker_factor)
                duration = slow_batches.get((epoch, batch), duration)
                emit(fmt.KIND_GETNEXT, fmt.PHASE_ITER, fmt.getnext_event_name(TRAIN_ITER), t, t + duration,
                     {fmt.ARG_WORKER_ID: worker, fmt.ARG_STEP: str(batch)}, worker_id=worker,
                     iterator_class=TRAIN_ITER, epoch=epoch)
                t += duration
                step_end = t + rng.randint(*step_us)
                emit(fmt.KIND_STEP, fmt.PHASE_STEP_TRAIN, fmt.PHASE_STEP_TRAIN, t, step_end,
                     {fmt.ARG_STEP: str(batch)}, epoch=epoch)
                t = step_end
            for worker in range(num_workers):
                worker_pid = next_worker_pid
                next_worker_pid += 1
                emit(fmt.KIND_WORKER, fmt.PHASE_WORKER, fmt.worker_event_name(TRAIN_ITER), init_start,
                     t + 2_000, {fmt.ARG_WORKER_ID: worker, fmt.ARG_NUM_WORKERS: num_workers,
                                 fmt.ARG_STEP: str(train_batches - 1)},
                     os_pid=worker_pid, event_pid=worker_pid, worker_id=worker, num_workers=num_workers,
                     iterator_class=TRAIN_ITER, epoch=epoch)
            t += 5_000
            # validation loader, single process
            if val_batches:
                init_start, t = t, t + rng.randint(100, 300)
                emit(fmt.KIND_INIT, fmt.PHASE_INIT, fmt.init_event_name(VAL_ITER), init_start, t,
                     {fmt.ARG_NUM_WORKERS: 0, fmt.ARG_PIN_MEMORY: False, fmt.ARG_STEP: "-1"},
                     num_workers=0, pin_memory=False, iterator_class=VAL_ITER, epoch=epoch)
                for batch in range(val_batches):
                    duration = rng.randint(*getnext_us)
                    emit(fmt.KIND_GETNEXT, fmt.PHASE_ITER, fmt.getnext_event_name(VAL_ITER), t, t + duration,
                         {fmt.ARG_WORKER_ID: -1, fmt.ARG_STEP: str(batch)}, worker_id=-1,
                         iterator_class=VAL_ITER, epoch=epoch)
                    t += duration
                    step_end = t + rng.randint(*step_us) // 2
                    emit(fmt.KIND_STEP, fmt.PHASE_STEP_EVAL, fmt.PHASE_STEP_EVAL, t, step_end,
                         {fmt.ARG_STEP: str(batch)}, epoch=epoch)
                    t = step_end
            t += 5_000
        writer.close()
        trial.framework_files += writer.closed_keys
        end_of_job = max(end_of_job, t)

    if system:
        for host in range(1, hosts + 1):
            written, keys = _system_metrics(folder, host, start_us / 1e6 + system_start_delay_s, end_of_job, rng,
                                            interval_s=system_interval_s, cpus=cpus, gpus=gpus,
                                            cpu_percent=cpu_percent, iowait_percent=iowait_percent)
            trial.system_samples += written
            trial.system_files += keys
    return trial


def _system_metrics(folder: str, host: int, start_s: float, end_us: int, rng: random.Random, *, interval_s: float,
                    cpus: int, gpus: int, cpu_percent: float, iowait_percent: float) -> tuple[int, list[str]]:
    """A host's system metrics every `interval_s` from start_s to the job's end: (records
    written, closed files)."""
    metrics = SystemMetricsWriter(folder, fmt.system_node_id(host), rotate_s=60)
    written, ts = 0, start_s
    while ts <= end_us / 1e6 + interval_s:
        records = []
        for cpu in range(cpus):
            records.append(("cpu", f"cpu{cpu}", "CPUUtilization",
                            round(min(100.0, max(0.0, rng.gauss(cpu_percent, 3))), 2), ts))
            records.append(("cpu", f"cpu{cpu}", "I/OWaitPercentage", iowait_percent, ts))
        for gpu in range(gpus):
            records.append(("gpu", f"gpu{gpu}", "GPUUtilization", round(rng.uniform(20, 90), 2), ts))
            records.append(("gpu", f"gpu{gpu}", "GPUMemoryUtilization", round(rng.uniform(30, 40), 2), ts))
        records += [("memory", "MemoryUsedPercent", "", round(rng.uniform(20, 30), 2), ts),
                    ("i/o", "IOPS", "", float(rng.randint(0, 50)), ts),
                    ("i/o", "ReadThroughputInBytesPerSecond", "", float(rng.randint(0, 10**6)), ts),
                    ("i/o", "WriteThroughputInBytesPerSecond", "", float(rng.randint(0, 10**5)), ts),
                    ("network", "ReceiveBytesPerSecond", "Algorithm", float(rng.randint(0, 10**5)), ts),
                    ("network", "TransmitBytesPerSecond", "Algorithm", float(rng.randint(0, 10**5)), ts)]
        metrics.write(records)
        written += len(records)
        ts += interval_s
    metrics.close()
    return written, metrics.closed_keys


def write_job(folder: str, *, hosts: int = 2, ranks_per_host: int = 4, epochs: int = 2, steps: int = 50,
              num_workers: int = 2, getnext_us: tuple[int, int] = (800, 1200),
              step_us: tuple[int, int] = (9_000, 11_000), slow_rank: int | None = None,
              slow_rank_us: tuple[int, int] = (8_000, 12_000), slow_storage_host: int | None = None,
              storage_us: tuple[int, int] = (5_000, 7_000), storage_iowait_percent: float = 35.0,
              record_ranks: bool = True, system: bool = True, system_interval_s: float = 1.0, cpus: int = 4,
              cpu_percent: float = 40.0, start_us: int = 1_795_986_600_000_000, rotate_s: float = 60.0,
              seed: int = 0, main_pid: int = 30_000) -> SyntheticTrial:
    """A distributed job: `hosts` x `ranks_per_host` training processes, each with a
    multi-process train loader per epoch and a step after each batch, named as the collector
    names ranks (`<rank>-algo-<host>`).

    slow_rank: that rank's GetNexts take `slow_rank_us`. slow_storage_host: every rank of that
    host (1-based) waits `storage_us` per GetNext, and the host's I/O wait is high.
    record_ranks: write the rank and local rank on the init events, as the collector does;
    False leaves the node id's number alone to say it is a rank (the reference's trials).
    """
    rng = random.Random(seed)
    trial = SyntheticTrial(folder)
    end_of_job = start_us
    for host in range(1, hosts + 1):
        for local in range(ranks_per_host):
            rank = (host - 1) * ranks_per_host + local
            pid = main_pid + 10 * rank
            node = fmt.framework_node_id(rank, host)
            writer = TraceWriter(folder, node, start_time_us=start_us, rotate_s=rotate_s)
            waits = (slow_rank_us if rank == slow_rank else storage_us if host == slow_storage_host
                     else getnext_us)
            t = start_us + rng.randint(0, 2_000)
            for epoch in range(epochs):
                init_start, t = t, t + rng.randint(20_000, 30_000)
                args = {fmt.ARG_PID: pid, fmt.ARG_NUM_WORKERS: num_workers, fmt.ARG_PIN_MEMORY: False,
                        fmt.ARG_STEP: "-1"}
                if record_ranks:
                    args.update({fmt.ARG_RANK: rank, fmt.ARG_LOCAL_RANK: local})
                writer.complete(fmt.PHASE_INIT, fmt.init_event_name(TRAIN_ITER), init_start, t, args)
                trial.events.append(SyntheticEvent(fmt.KIND_INIT, node, pid, fmt.init_event_name(TRAIN_ITER),
                                                   init_start, t, num_workers=num_workers, pin_memory=False,
                                                   iterator_class=TRAIN_ITER, epoch=epoch, rank=rank))
                for batch in range(steps):
                    worker = batch % num_workers
                    wait = rng.randint(*waits)
                    writer.complete(fmt.PHASE_ITER, fmt.getnext_event_name(TRAIN_ITER), t, t + wait,
                                    {fmt.ARG_PID: pid, fmt.ARG_WORKER_ID: worker, fmt.ARG_STEP: str(batch)})
                    trial.events.append(SyntheticEvent(fmt.KIND_GETNEXT, node, pid, fmt.getnext_event_name(TRAIN_ITER),
                                                       t, t + wait, worker_id=worker, iterator_class=TRAIN_ITER,
                                                       epoch=epoch, rank=rank))
                    t += wait
                    step_end = t + rng.randint(*step_us)
                    writer.complete(fmt.PHASE_STEP_TRAIN, fmt.PHASE_STEP_TRAIN, t, step_end,
                                    {fmt.ARG_PID: pid, fmt.ARG_STEP: str(batch)})
                    trial.events.append(SyntheticEvent(fmt.KIND_STEP, node, pid, fmt.PHASE_STEP_TRAIN, t, step_end,
                                                       epoch=epoch, rank=rank))
                    t = step_end
                t += 5_000
            writer.close()
            trial.framework_files += writer.closed_keys
            end_of_job = max(end_of_job, t)
    if system:
        for host in range(1, hosts + 1):
            iowait = storage_iowait_percent if host == slow_storage_host else 0.5
            written, keys = _system_metrics(folder, host, start_us / 1e6, end_of_job, rng, interval_s=system_interval_s,
                                            cpus=cpus, gpus=0, cpu_percent=cpu_percent, iowait_percent=iowait)
            trial.system_samples += written
            trial.system_files += keys
    return trial
