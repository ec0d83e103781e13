"""Inside DataLoader worker processes: lifetime and (optionally) per-batch fetch records.

The training process replaces `torch.utils.data._utils.worker._worker_loop` with a
`WorkerLoop` (a picklable callable) for the moment it creates an iterator, so torch
hands it to `Process(target=...)`: with fork it is called as it is; with spawn and
forkserver it is pickled with its settings and unpickled in the fresh worker, which
imports this module. Either way the worker records into its own spool file,
`<spool>/<pid>.w`, one line per record:

    S <pid> <worker_id> <num_workers> <iterator_id> <created_ns> <entry_ns>
    F <start_ns> <end_ns> <collate_ns> <cpu_ns> <runq_ns>
                                                (one per batch fetched, optional; cpu_ns: the
                                                process's CPU time during the fetch; runq_ns:
                                                its time runnable but waiting for a core, -1
                                                where the kernel does not say)
    E <end_ns> <how>                            (exit | term | error)

`created_ns` is the process's creation time as the kernel recorded it (Linux, 10 ms
resolution; equal to entry_ns elsewhere); the lifetime starts there, so spawn's
interpreter start-up belongs to the worker. The end is written when the loop returns
(the main process's stop signal or its death), in a `finally`, or on SIGTERM (the main
process terminates workers that do not stop in time), then the file is closed. The
sink reads the spool files and puts the records into the training process's trace.
Nothing here may raise into torch: every failure disables recording in this worker.
"""
from __future__ import annotations

import os
import signal
import time

# Each fetch record is written at once (one small write, a few microseconds against a
# batch's milliseconds, in the worker, never the training process): a persistent worker
# outlives the collector when the loader is still alive at stop(), and whatever it
# held back then would be lost, and with it the diagnosis's service times.
FLUSH_EVERY_S = 0.0
FLUSH_EVERY_RECORDS = 1

# The real torch worker loop, set by the training process (inherited by fork children).
ORIGINAL_LOOP = None


def original_loop():
    from torch.utils.data._utils import worker as torch_worker

    loop = torch_worker._worker_loop
    if isinstance(loop, WorkerLoop):
        loop = ORIGINAL_LOOP
    return loop


class WorkerLoop:
    """Stands in for torch's `_worker_loop`; records the worker around the real one."""

    def __init__(self, spool_dir: str, iterator_id: int, positions: dict, fetch: bool):
        self.spool_dir = spool_dir
        self.iterator_id = iterator_id
        # Positional index of the loop's parameters we read or wrap (from its signature).
        self.positions = dict(positions)
        self.fetch = fetch

    def __call__(self, *args, **kwargs):
        loop = original_loop()
        recorder = None
        try:
            recorder = _Recorder(self, args, kwargs)
            args, kwargs = recorder.prepare(args, kwargs)
        except BaseException:  # never break the worker for a record
            recorder = None
        how = "error"
        try:
            result = loop(*args, **kwargs)
            how = "exit"
            return result
        finally:
            if recorder is not None:
                recorder.finish(how)


def _argument(args, kwargs, positions, name):
    index = positions.get(name)
    if index is not None and index < len(args):
        return args[index]
    return kwargs.get(name)


def process_created_ns() -> int | None:
    """This process's creation time (epoch ns) from /proc, or None off Linux."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            stat = handle.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        start_ticks = int(fields[19])  # field 22, starttime, in clock ticks since boot
        ticks_per_s = os.sysconf("SC_CLK_TCK")
        since_boot_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        return time.time_ns() - (since_boot_ns - start_ticks * 1_000_000_000 // ticks_per_s)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class _TimedCollate:
    """Wraps the loader's collate_fn in the worker to time collation per batch."""

    def __init__(self, collate_fn, recorder):
        self.collate_fn = collate_fn
        self.recorder = recorder

    def __call__(self, batch):
        start = time.time_ns()
        try:
            return self.collate_fn(batch)
        finally:
            self.recorder.collate_ns += time.time_ns() - start


class _Recorder:
    def __init__(self, loop: WorkerLoop, args, kwargs):
        self.pid = os.getpid()
        entry_ns = time.time_ns()
        created_ns = process_created_ns()
        if created_ns is None or not 0 <= entry_ns - created_ns < 3_600_000_000_000:
            created_ns = entry_ns
        self.loop = loop
        self.worker_id = _argument(args, kwargs, loop.positions, "worker_id")
        self.num_workers = _argument(args, kwargs, loop.positions, "num_workers")
        self.finished = False
        self.pending: list[str] = []
        self.last_flush_ns = entry_ns
        self.collate_ns = 0
        self.fd = os.open(os.path.join(loop.spool_dir, f"{self.pid}.w"),
                          os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._write(f"S {self.pid} {_int(self.worker_id)} {_int(self.num_workers)} {loop.iterator_id} "
                    f"{created_ns} {entry_ns}\n")

    def prepare(self, args, kwargs):
        self._install_sigterm()
        if self.loop.fetch:
            args, kwargs = self._time_fetches(args, kwargs)
        return args, kwargs

    # -- records -------------------------------------------------------------------
    def _write(self, text: str) -> None:
        data = text.encode()
        while data:
            written = os.write(self.fd, data)
            data = data[written:]

    def fetched(self, start_ns: int, end_ns: int, cpu_ns: int, runq_ns: int) -> None:
        try:
            self.pending.append(f"F {start_ns} {end_ns} {self.collate_ns} {cpu_ns} {runq_ns}\n")
            self.collate_ns = 0
            if len(self.pending) >= FLUSH_EVERY_RECORDS or end_ns - self.last_flush_ns >= FLUSH_EVERY_S * 1e9:
                self.flush(end_ns)
        except Exception:  # never into torch's fetch
            pass

    def flush(self, now_ns: int | None = None) -> None:
        if self.finished or not self.pending:
            return
        text, self.pending = "".join(self.pending), []
        self.last_flush_ns = now_ns or time.time_ns()
        try:
            self._write(text)
        except OSError:  # spool gone (the collector stopped): stop recording
            self.finished = True

    def finish(self, how: str) -> None:
        if self.finished:
            return
        try:
            end_ns = time.time_ns()
            self.flush(end_ns)
            if not self.finished:
                self._write(f"E {end_ns} {how}\n")
        except BaseException:
            pass
        self.finished = True
        try:
            os.close(self.fd)
        except OSError:
            pass

    # -- hooks in the worker -------------------------------------------------------
    def _install_sigterm(self) -> None:
        """Record the end when terminated, then die of SIGTERM as before."""
        try:
            current = signal.getsignal(signal.SIGTERM)
            if current is not signal.SIG_DFL and not getattr(current, "dashboard_collector_cli", False):
                return  # someone else's handler: leave it alone

            def on_sigterm(signum, frame):
                self.finish("term")
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

            signal.signal(signal.SIGTERM, on_sigterm)
        except (ValueError, OSError, AttributeError):  # not the main thread, or no SIGTERM
            pass

    def _time_fetches(self, args, kwargs):
        from torch.utils.data._utils import fetch as torch_fetch

        recorder = self
        now, cpu_now, waited = time.time_ns, time.process_time_ns, _run_queue_reader()
        for name in ("_MapDatasetFetcher", "_IterableDatasetFetcher"):
            cls = getattr(torch_fetch, name, None)
            original = getattr(cls, "fetch", None) if cls is not None else None
            if original is None or getattr(original, "_dlp_timed", False):
                continue

            def fetch(self, possibly_batched_index, _original=original):
                # CPU time beside wall time tells a worker that computes from one that waits
                # (storage, network, a lock): the what-if stretches only the computing part
                # when workers outnumber the free cores.
                cpu_start, queued, start = cpu_now(), waited(), now()
                data = _original(self, possibly_batched_index)
                end, cpu_end, queued_end = now(), cpu_now(), waited()
                recorder.fetched(start, end, cpu_end - cpu_start, queued_end - queued if queued >= 0 else -1)
                return data

            fetch._dlp_timed = True
            cls.fetch = fetch
        index = self.loop.positions.get("collate_fn")
        if index is not None and index < len(args) and callable(args[index]):
            args = list(args)
            args[index] = _TimedCollate(args[index], self)
            args = tuple(args)
        elif callable(kwargs.get("collate_fn")):
            kwargs = dict(kwargs, collate_fn=_TimedCollate(kwargs["collate_fn"], self))
        return args, kwargs


def _run_queue_reader():
    """A function returning this thread's time spent runnable but waiting for a core (ns),
    from Linux's /proc/thread-self/schedstat (its second field), or -1 where there is none.
    One pread of a small file: a few microseconds, in the worker only."""
    try:
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        os.pread(fd, 128, 0).split()[1]
    except (OSError, IndexError, AttributeError):
        return lambda: -1

    def read() -> int:
        try:
            return int(os.pread(fd, 128, 0).split()[1])
        except (OSError, IndexError, ValueError):
            return -1

    return read


def _int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1
