"""The sink: turns a training process's records into trial files.

It runs as a small side process of the training process (`python -c ... sink.main`,
standard input = the record stream of protocol.py), so that formatting JSON, writing
files, sampling system metrics and uploading to S3 cost the training process nothing.
(Where no Python executable can be started it runs on a thread of the training
process instead: the same code, on a pipe.) Its duties:

- GetNext and control records -> framework events of the training process's node;
- worker spool files (worker.py) -> worker lifetime and fetch events of the same node,
  so that a rank's workers stay with their rank;
- system metrics (system.py) of this host when this process records them;
- every `tick_s`: flush the open `.tmp` files (live view) and rotate them;
- S3 output: files are written to a local staging folder and each closed file is
  uploaded in the background; one that cannot be uploaded stays there and is reported.

At the end of the stream (Q frame or EOF: the training process stopped or died) it
reads the spool one last time, closes every file and finishes the uploads.
"""
from __future__ import annotations

import bisect
import json
import os
import queue
import select
import shutil
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass

from .. import format as fmt
from . import protocol
from .writer import SystemMetricsWriter, TraceWriter

# Written by this collector only: iter() start -> end of the first batch of that iterator.
PHASE_FIRST_BATCH = fmt.PHASE_FIRST_BATCH
ARG_TIME_TO_FIRST_BATCH = "time_to_first_batch_us"
DEFAULT_MP_ITER = "_MultiProcessingDataLoaderIter"
PHASES = (fmt.PHASE_INIT, fmt.PHASE_ITER, fmt.PHASE_WORKER)
UPLOAD_ATTEMPTS = 3
UPLOADS_NAMED = 10  # files named in the warning about uploads given up; the rest are counted

_dumps = json.JSONEncoder(separators=(", ", ": "), allow_nan=False).encode


def first_batch_event_name(iter_class: str) -> str:
    return f"{iter_class}.first_batch"


def fetch_event_name(iter_class: str) -> str:
    return f"{iter_class}.fetch"


def warn(message: str) -> None:
    try:
        sys.stderr.write(f"dashboard.collector: warning: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass


@dataclass
class SinkConfig:
    out: str  # local folder or s3://bucket/prefix
    node: str
    system_node: str | None
    start_us: int
    main_pid: int
    spool_dir: str
    rotate_s: float = 60.0
    system_interval_s: float | None = 0.5
    gpu: bool = True
    tick_s: float = 0.5
    upload_timeout_s: float = protocol.DEFAULT_UPLOAD_TIMEOUT_S
    rank: int | None = None  # the training rank and local rank, when the job is distributed
    local_rank: int | None = None

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> "SinkConfig":
        return cls(**json.loads(text))


class _Loader:
    __slots__ = ("batches", "init_starts", "init_ids")

    def __init__(self):
        self.batches = 0  # GetNexts served so far: the step_num of the next one
        self.init_starts: list[int] = []  # iter() start (us) of each of its iterators, in order
        self.init_ids: list[int] = []

    def iterator_at(self, time_us: int, default: int) -> int:
        """The iterator id of this loader's latest iter() started by `time_us`."""
        at = bisect.bisect_right(self.init_starts, time_us) - 1
        return self.init_ids[at] if at >= 0 else default


class _Iterator:
    """What the sink knows of one iter() call (one iterator_id)."""

    def __init__(self, iid: int, cls: str, loader: _Loader, pid: int, num_workers, init_start_us=None,
                 step0: int = 0):
        self.iid = iid
        self.cls = cls
        self.loader = loader
        self.pid = pid
        self.num_workers = num_workers
        self.init_start_us = init_start_us
        self.step0 = step0
        self.first_pending = init_start_us is not None
        self.template = None
        self.template_no_worker = None


class _Uploader:
    """Uploads closed files to S3 on a thread, in order; keeps what it cannot upload."""

    def __init__(self, url: str):
        self.url = url
        self.queue: queue.Queue = queue.Queue()
        self.failed: list[str] = []
        self.uploaded = 0
        # key -> local path of every file not uploaded yet (queued, in flight or failed): what
        # stays local when the uploads are given up.
        self.local: dict[str, str] = {}
        self._store = None
        # A daemon: a sink that gives up on a hung S3 exits without waiting for it.
        self._thread = threading.Thread(target=self._run, name="dashboard-collector-upload", daemon=True)
        self._thread.start()

    def enqueue(self, key: str, path: str) -> None:
        self.local[key] = path
        self.queue.put((key, path))

    def _run(self) -> None:
        from ..trial.errors import TrialAccessError, TrialNotFoundError
        from ..trial.store import S3Store

        while True:
            item = self.queue.get()
            if item is None:
                return
            key, path = item
            for attempt in range(UPLOAD_ATTEMPTS):
                try:
                    if self._store is None:
                        self._store = S3Store(self.url)
                    self._store.put_file(key, path)
                    os.remove(path)
                    self.local.pop(key, None)
                    self.uploaded += 1
                    break
                except Exception as exc:
                    # No bucket, no access: trying again will not help (boto3 already
                    # retried throttling and connection errors on its own).
                    permanent = isinstance(exc, (TrialAccessError, TrialNotFoundError))
                    if permanent or attempt + 1 == UPLOAD_ATTEMPTS:
                        warn(f"cannot upload {key} ({exc}); kept at {path}")
                        self.failed.append(path)
                        break
                    time.sleep(2 ** attempt)

    def finish(self, timeout_s: float) -> bool:
        self.queue.put(None)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


class _Spool:
    """Reads the workers' spool files incrementally (see worker.py for the lines)."""

    def __init__(self, sink: "Sink"):
        self.sink = sink
        self.files: dict[str, dict] = {}

    def poll(self, final: bool = False) -> None:
        try:
            names = sorted(e.name for e in os.scandir(self.sink.config.spool_dir) if e.name.endswith(".w"))
        except OSError:
            return
        for name in names:
            state = self.files.setdefault(name, {"offset": 0, "partial": b"", "start": None, "done": False,
                                                 "held": []})
            if not state["done"]:
                self._read(name, state)
        if final:
            for name, state in self.files.items():
                if state["held"]:
                    self.sink.write_fetches(state["start"], state["held"])
                    state["held"] = []
                if not state["done"] and state["start"] is not None:
                    self._end_unseen(name, state)

    def _read(self, name: str, state: dict) -> None:
        path = os.path.join(self.sink.config.spool_dir, name)
        try:
            with open(path, "rb") as handle:
                handle.seek(state["offset"])
                data = handle.read()
        except OSError:
            return
        state["offset"] += len(data)
        lines = (state["partial"] + data).split(b"\n")
        state["partial"] = lines.pop()
        fetches = []
        for line in lines:
            fields = line.split()
            try:
                if not fields:
                    continue
                if fields[0] == b"F" and state["start"] is not None:
                    # CPU and run-queue times (5th, 6th fields): absent in older collectors' spools
                    cpu_ns = int(fields[4]) if len(fields) > 4 else -1000
                    runq_ns = int(fields[5]) if len(fields) > 5 else -1000
                    fetches.append((int(fields[1]), int(fields[2]), int(fields[3]), cpu_ns, runq_ns))
                elif fields[0] == b"S":
                    pid, wid, nw, iid, created, entry = (int(f) for f in fields[1:7])
                    state["start"] = {"pid": pid, "worker_id": wid, "num_workers": nw, "iid": iid,
                                      "created_ns": created, "entry_ns": entry}
                elif fields[0] == b"E" and state["start"] is not None:
                    how = fields[2].decode(errors="replace") if len(fields) > 2 else "exit"
                    self.sink.write_worker(state["start"], int(fields[1]), how)
                    state["done"] = True
            except (ValueError, IndexError):
                self.sink.problems += 1
        # A fetch belongs to the iterator whose iter() came last before it: held until the
        # training process's records have come past its start (a worker's spool can be read
        # before the iter() that started its epoch reaches the sink).
        seen = self.sink.main_seen_ns
        waiting, ready, state["held"] = state["held"] + fetches, [], []
        for fetch in waiting:
            (ready if fetch[0] <= seen else state["held"]).append(fetch)
        if ready:
            self.sink.write_fetches(state["start"], ready)
        if state["done"]:
            try:
                os.remove(path)
            except OSError:
                pass

    def _end_unseen(self, name: str, state: dict) -> None:
        """A worker without an end record when the recording stops: still running
        (persistent workers of a live loader) or killed (SIGKILL). The event ends now,
        or at the last write of a dead worker's spool file."""
        start = state["start"]
        end_ns = time.time_ns()
        how = "running"
        if not _alive(start["pid"]):
            how = "lost"
            try:
                end_ns = os.stat(os.path.join(self.sink.config.spool_dir, name)).st_mtime_ns
            except OSError:
                pass
        self.sink.write_worker(start, max(end_ns, start["created_ns"]), how)
        state["done"] = True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    try:  # a zombie (exited, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] != b"Z"
    except (OSError, ValueError):
        return True


class Sink:
    def __init__(self, config: SinkConfig):
        self.config = config
        self._warned: set[str] = set()
        self.problems = 0
        self.getnext_count = 0
        self.main_seen_ns = 0  # the latest time the training process's records reached
        self._closed = False
        self.uploader = None
        self.staging = None
        if config.out.startswith("s3://"):
            self.staging = tempfile.mkdtemp(prefix="dashboard-collector-staging-")
            self.uploader = _Uploader(config.out)
            root, on_close = self.staging, self.uploader.enqueue
        else:
            root, on_close = config.out, None
            os.makedirs(root, exist_ok=True)
        self.trace = TraceWriter(root, config.node, start_time_us=config.start_us, rotate_s=config.rotate_s,
                                 on_close=on_close, phases=PHASES)
        self._base_us = self.trace.start_time_us
        self._pid_init = self.trace.phase_pid(fmt.PHASE_INIT)
        self._pid_iter = self.trace.phase_pid(fmt.PHASE_ITER)
        self.iterators: dict[int, _Iterator] = {}
        self.loaders: dict[int, _Loader] = {}
        self.spool = _Spool(self)
        self.system = None
        self.sampler = None
        if config.system_node and config.system_interval_s:
            self.system = SystemMetricsWriter(root, config.system_node, rotate_s=60.0, on_close=on_close)
            try:
                from .system import SystemSampler

                self.sampler = SystemSampler(self.system.write, config.system_interval_s, config.gpu,
                                             on_error=self._warn_once)
                self.sampler.start()
            except ImportError as exc:
                warn(f"no system metrics: {exc} (pip install psutil)")

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            warn(message)

    # -- the stream ----------------------------------------------------------------
    def run(self, fd: int) -> None:
        """Read frames from `fd` until Q or EOF, ticking between reads; then finish."""
        reader = protocol.FrameReader()
        next_tick = time.monotonic() + self.config.tick_s
        poller = select.poll()  # not select(): the fd may be above FD_SETSIZE in a busy process
        poller.register(fd, select.POLLIN | select.POLLHUP)
        try:
            done = False
            while not done:
                ready = poller.poll(max(0.0, next_tick - time.monotonic()) * 1000)
                if ready:
                    data = os.read(fd, 1 << 20)
                    if not data:
                        break
                    for kind, payload in reader.feed(data):
                        if kind == protocol.QUIT:
                            done = True
                            break
                        self._handle(kind, payload)
                if time.monotonic() >= next_tick:
                    self.tick()
                    next_tick = time.monotonic() + self.config.tick_s
        finally:
            self.finish()

    def _handle(self, kind: bytes, payload: bytes) -> None:
        try:
            if kind == protocol.GETNEXT:
                self.write_getnexts(protocol.getnext_records(payload))
            elif kind == protocol.CONTROL:
                self._control(json.loads(payload))
        except Exception as exc:  # one bad frame never stops the sink
            self.problems += 1
            self._warn_once(f"a record could not be written ({type(exc).__name__}: {exc})")

    def tick(self) -> None:
        try:
            self.spool.poll()
            now_us = time.time_ns() // 1000
            self.trace.rotate_if_due(now_us)
            self.trace.flush()
            if self.system is not None:
                self.system.rotate_if_due(now_us / 1e6)
                self.system.flush()
        except Exception as exc:
            self._warn_once(f"writing the trial failed ({type(exc).__name__}: {exc})")

    def finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        steps = [lambda: self.spool.poll(final=True), self.trace.close]
        if self.sampler is not None:
            steps.append(self.sampler.stop)
        if self.system is not None:
            steps.append(self.system.close)
        for step in steps:
            try:
                step()
            except Exception as exc:
                warn(f"closing the trial: {type(exc).__name__}: {exc}")
        shutil.rmtree(self.config.spool_dir, ignore_errors=True)
        if self.uploader is not None:
            if not self.uploader.finish(self.config.upload_timeout_s):
                # The job's end waits no longer (an S3 that accepts connections and never answers
                # held it for minutes): what is not uploaded stays where it is, and is named.
                local = sorted(dict(self.uploader.local))
                named = ", ".join(local[:UPLOADS_NAMED]) + (f" and {len(local) - UPLOADS_NAMED} more"
                                                            if len(local) > UPLOADS_NAMED else "")
                warn(f"uploads to {self.config.out} did not finish in {self.config.upload_timeout_s:g} s "
                     f"(--upload-timeout-s); {len(local)} file(s) stayed local in {self.staging}: {named}")
            elif not self.uploader.failed:
                shutil.rmtree(self.staging, ignore_errors=True)

    # -- events --------------------------------------------------------------------
    def _loader(self, lid: int) -> _Loader:
        loader = self.loaders.get(lid)
        if loader is None:
            loader = self.loaders[lid] = _Loader()
        return loader

    def _control(self, record: dict) -> None:
        kind = record.get("t")
        iid = int(record["iid"])
        loader = self._loader(int(record.get("lid", -iid)))
        cls = str(record.get("cls") or "_BaseDataLoaderIter")
        pid = int(record.get("pid", self.config.main_pid))
        self.main_seen_ns = max(self.main_seen_ns, int(record.get("t1", 0)))
        if kind == "init":
            start_us, end_us = int(record["t0"]) // 1000, int(record["t1"]) // 1000
            info = _Iterator(iid, cls, loader, pid, record.get("nw"), start_us, loader.batches)
            self.iterators[iid] = info
            if not loader.init_starts or start_us >= loader.init_starts[-1]:
                loader.init_starts.append(start_us)
                loader.init_ids.append(iid)
            args = {fmt.ARG_PID: pid, fmt.ARG_NUM_WORKERS: record.get("nw"),
                    fmt.ARG_PIN_MEMORY: bool(record.get("pin")),
                    fmt.ARG_PERSISTENT: bool(record.get("pers")),
                    fmt.ARG_PREFETCH: record.get("pf"), fmt.ARG_IN_ORDER: bool(record.get("order", True)),
                    fmt.ARG_ITERATOR_ID: iid,
                    fmt.ARG_STEP: str(loader.batches)}
            if self.config.rank is not None:
                args[fmt.ARG_RANK] = self.config.rank
            if self.config.local_rank is not None:
                args[fmt.ARG_LOCAL_RANK] = self.config.local_rank
            self._write_one(self._pid_init, fmt.init_event_name(cls), start_us, end_us, args)
        elif kind == "end":
            start_us, end_us = int(record["t0"]) // 1000, int(record["t1"]) // 1000
            self._write_one(self.trace.phase_pid(fmt.PHASE_EPOCH_END), fmt.epoch_end_event_name(cls), start_us,
                            end_us, {fmt.ARG_PID: pid, fmt.ARG_ITERATOR_ID: iid})
        elif kind == "adopt":  # an iterator created before the recording started
            self.iterators[iid] = _Iterator(iid, cls, loader, pid, record.get("nw"), None, loader.batches)

    def _write_one(self, trace_pid: int, name: str, start_us: int, end_us: int, args: dict) -> None:
        self.trace.write_events(
            ',\n{"name": %s, "pid": %d, "ph": "X", "ts": %d, "dur": %d, "args": %s}'
            % (_dumps(name), trace_pid, start_us - self._base_us, max(0, end_us - start_us), _dumps(args)),
            start_us, end_us)

    def _templates(self, info: _Iterator) -> None:
        head = ',\n{"name": %s, "pid": %d, "ph": "X", "ts": %%d, "dur": %%d, "args": {"pid": %d, ' % (
            _dumps(fmt.getnext_event_name(info.cls)), self._pid_iter, info.pid)
        tail = '"iterator_id": %d}}' % info.iid
        info.template = head + '"step_num": "%d", "worker_id": %d, ' + tail
        info.template_no_worker = head + '"step_num": "%d", ' + tail

    def write_getnexts(self, records) -> None:
        if not len(records):
            return
        base = self._base_us
        parts = []
        iterators = self.iterators
        first_us = None
        last_us = 0
        info = None
        it = iter(records)
        bits, mask = protocol.WORKER_BITS, (1 << protocol.WORKER_BITS) - 1
        for t0, t1, source in zip(it, it, it):
            iid, worker = source >> bits, (source & mask) - 2
            if info is None or info.iid != iid:
                info = iterators.get(iid)
                if info is None:
                    info = iterators[iid] = _Iterator(iid, "_BaseDataLoaderIter", self._loader(-iid),
                                                      self.config.main_pid, None)
                if info.template is None:
                    self._templates(info)
                template, template_no_worker, loader = info.template, info.template_no_worker, info.loader
            start_us, end_us = t0 // 1000, t1 // 1000
            step = loader.batches
            loader.batches = step + 1
            if worker >= -1:
                parts.append(template % (start_us - base, end_us - start_us, step, worker))
            else:
                parts.append(template_no_worker % (start_us - base, end_us - start_us, step))
            if first_us is None:
                first_us = start_us
            if end_us > last_us:
                last_us = end_us
            if info.first_pending:
                info.first_pending = False
                parts.append(self._first_batch_text(info, end_us))
        self.getnext_count += len(records) // protocol.RECORD_FIELDS
        self.main_seen_ns = max(self.main_seen_ns, records[-2])  # the last record's end
        self.trace.write_events("".join(parts), first_us, last_us)

    def _first_batch_text(self, info: _Iterator, end_us: int) -> str:
        pid = self.trace.phase_pid(PHASE_FIRST_BATCH)
        start_us = info.init_start_us
        args = {fmt.ARG_PID: info.pid, fmt.ARG_ITERATOR_ID: info.iid, fmt.ARG_NUM_WORKERS: info.num_workers,
                fmt.ARG_STEP: str(info.step0), ARG_TIME_TO_FIRST_BATCH: max(0, end_us - start_us)}
        return (',\n{"name": %s, "pid": %d, "ph": "X", "ts": %d, "dur": %d, "args": %s}'
                % (_dumps(first_batch_event_name(info.cls)), pid, start_us - self._base_us,
                   max(0, end_us - start_us), _dumps(args)))

    def _worker_class(self, iid: int) -> str:
        info = self.iterators.get(iid)
        return info.cls if info is not None and info.cls != "_BaseDataLoaderIter" else DEFAULT_MP_ITER

    def write_worker(self, start: dict, end_ns: int, how: str) -> None:
        info = self.iterators.get(start["iid"])
        start_us = min(start["created_ns"], start["entry_ns"]) // 1000
        end_us = max(start_us, end_ns // 1000)
        args = {fmt.ARG_PID: start["pid"], fmt.ARG_WORKER_ID: start["worker_id"],
                fmt.ARG_NUM_WORKERS: start["num_workers"], fmt.ARG_ITERATOR_ID: start["iid"],
                fmt.ARG_STEP: str(info.step0 if info is not None else -1),
                "startup_us": max(0, (start["entry_ns"] - start["created_ns"]) // 1000), "exit": how}
        self._write_one(self.trace.phase_pid(fmt.PHASE_WORKER), fmt.worker_event_name(self._worker_class(start["iid"])),
                        start_us, end_us, args)

    def write_fetches(self, start: dict, fetches: list) -> None:
        """Fetch events of one worker. A persistent worker serves every epoch's iterator:
        each fetch goes to the iterator of its loader whose iter() came last before it."""
        trace_pid = self.trace.phase_pid(fmt.PHASE_WORKER_FETCH)
        head = ',\n{"name": %s, "pid": %d, "ph": "X", "ts": %%d, "dur": %%d, "args": {"pid": %d, ' % (
            _dumps(fetch_event_name(self._worker_class(start["iid"]))), trace_pid, start["pid"])
        template = head + ('"worker_id": %d, "iterator_id": %%d, "collate_us": %%d, "cpu_us": %%d, "runq_us": %%d}}'
                           % start["worker_id"])
        spawned_by = self.iterators.get(start["iid"])
        loader = spawned_by.loader if spawned_by is not None else None
        base = self._base_us
        parts = []
        first_us, last_us = None, 0
        for t0, t1, collate_ns, cpu_ns, runq_ns in fetches:
            start_us, end_us = t0 // 1000, t1 // 1000
            iid = loader.iterator_at(start_us, start["iid"]) if loader is not None else start["iid"]
            parts.append(template % (start_us - base, max(0, end_us - start_us), iid, max(0, collate_ns) // 1000,
                                     cpu_ns // 1000 if cpu_ns >= 0 else -1, runq_ns // 1000 if runq_ns >= 0 else -1))
            first_us = start_us if first_us is None else min(first_us, start_us)
            last_us = max(last_us, end_us)
        self.trace.write_events("".join(parts), first_us, last_us)


def run_sink(config: SinkConfig, fd: int) -> int:
    """Run a sink on `fd` until the stream ends; 0 when it closed the trial cleanly."""
    try:
        sink = Sink(config)
    except Exception as exc:
        warn(f"cannot write the trial to {config.out}: {type(exc).__name__}: {exc}")
        # Drain the stream so the training process never blocks on a full pipe.
        try:
            while os.read(fd, 1 << 20):
                pass
        except OSError:
            pass
        return 1
    try:
        sink.run(fd)
    except Exception:
        warn("the sink failed:\n" + traceback.format_exc())
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    config = SinkConfig.from_json(argv[0])
    return run_sink(config, sys.stdin.fileno())


if __name__ == "__main__":
    sys.exit(main())
