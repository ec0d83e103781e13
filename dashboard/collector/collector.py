"""Recording DataLoader profiles in a training process.

    from dashboard.collector import profile_dataloaders

    with profile_dataloaders("s3://bucket/job/profiler-output"):
        train()

While a Collector is active, torch's DataLoader is instrumented (hooks.py) and the
records go, through an in-memory buffer drained every `flush_s`, to a sink process
(sink.py) that writes the trial. The training process pays only for the records:
two clock reads and three numbers appended to an array per batch, about 0.6 to 0.9 us
(bench/collector_overhead.py); formatting, files, uploads and system metrics are the
sink's.

The collector never raises into the training loop: a failure of its own (torch
internals it does not know, a sink that died, a folder it cannot write) is a
CollectorWarning, after which it records less or nothing, and training goes on.
Wrong arguments to the constructor are errors (TypeError / ValueError) before any
training starts.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from array import array

from . import protocol
from .identity import identify

MAX_BUFFERED_RECORDS = 5_000_000  # 160 MB: a sink that cannot keep up loses records instead
DEFAULT_UPLOAD_TIMEOUT_S = protocol.DEFAULT_UPLOAD_TIMEOUT_S  # see there


class CollectorWarning(RuntimeWarning):
    """The collector records less than asked (or nothing); training is unaffected."""


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Buffer:
    """The training process's side of the record stream.

    GetNext records go straight into an int64 array, three numbers per batch (start,
    end, source), appended lock-free by the hooks: no object survives a batch, so
    recording adds nothing for the garbage collector to track. Control records (iter()
    calls, rare) are kept apart with the index of the GetNext record they precede, under
    a lock that only they and `drain()` take; `drain()` frames everything so far in order.
    """

    def __init__(self):
        self.getnext = array("q")
        # One record, [start_ns, end_ns, source]: `fromlist` resizes once and rolls back
        # whole on a bad value, so the array never holds a partial record.
        self.add = self.getnext.fromlist
        self._controls: list[tuple[int, bytes]] = []  # (GetNext records before it, payload)
        self._drained = 0  # GetNext records taken by drain() so far
        self._lock = threading.Lock()
        self.dropped = 0

    def control(self, record: dict) -> None:
        payload = protocol.control_payload(record)
        with self._lock:
            self._controls.append((self._drained + len(self.getnext) // protocol.RECORD_FIELDS, payload))

    def clear(self) -> None:
        with self._lock:
            del self.getnext[:]
            self._controls = []

    def drain(self) -> bytes:
        with self._lock:
            values = self.getnext
            count = len(values) - len(values) % protocol.RECORD_FIELDS
            chunk = values[:count]
            del values[:count]  # appends racing with this land after `count`: kept for next time
            controls, self._controls = self._controls, []
            base = self._drained
            self._drained += count // protocol.RECORD_FIELDS
        if count > MAX_BUFFERED_RECORDS * protocol.RECORD_FIELDS:
            self.dropped += count // protocol.RECORD_FIELDS
            chunk = array("q")
        if not controls:
            return protocol.getnext_frame(chunk) if count else b""
        out = []
        at = 0
        for position, payload in controls:
            cut = min(len(chunk), max(at, (position - base) * protocol.RECORD_FIELDS))
            if cut > at:
                out.append(protocol.getnext_frame(chunk[at:cut]))
            out.append(protocol.frame(protocol.CONTROL, payload))
            at = cut
        if at < len(chunk):
            out.append(protocol.getnext_frame(chunk[at:]))
        return b"".join(out)


class Collector:
    """Records DataLoader profiles while active; a context manager.

    out: a local folder or `s3://bucket/prefix` (the trial root).
    rotate_s: seconds per framework file (the live view's latency on S3).
    system_interval_s: system metrics sampling period (0.1 to 60 s); None or 0: none.
    gpu: sample GPUs through NVML when present.
    worker_fetch: also record each batch's fetch (and collate) time inside workers.
    flush_s: how often the training process hands its records to the sink.
    sidecar: run the sink as a side process (False: on a thread of this process).
    upload_timeout_s: how long the end of the job waits for the S3 uploads; past it, what is
        not uploaded stays in a local folder, named in a warning.
    stop_timeout_s: how long stop() waits for the sink's uploads, plus 30 s for it to close the
        files (default: upload_timeout_s): a sink that does not end by then goes on alone.
    """

    def __init__(self, out: str, *, rotate_s: float = 60.0, system_interval_s: float | None = 0.5,
                 gpu: bool = True, worker_fetch: bool = False, flush_s: float = 0.5,
                 sidecar: bool = True, upload_timeout_s: float = DEFAULT_UPLOAD_TIMEOUT_S,
                 stop_timeout_s: float | None = None):
        if not isinstance(out, (str, os.PathLike)) or not str(out).strip():
            raise ValueError("out: a local folder or s3://bucket/prefix is required")
        out = os.fspath(out).strip()
        if out.startswith("s3://"):
            if not out[len("s3://"):].split("/", 1)[0]:
                raise ValueError(f"out: no bucket in {out!r}")
        else:
            out = os.path.abspath(os.path.expanduser(out))
        if not rotate_s or rotate_s <= 0:
            raise ValueError("rotate_s must be positive")
        if system_interval_s and not 0.1 <= system_interval_s <= 60:
            raise ValueError("system_interval_s must be between 0.1 and 60 seconds (or None for none)")
        if flush_s <= 0:
            raise ValueError("flush_s must be positive")
        if not upload_timeout_s or upload_timeout_s <= 0:
            raise ValueError("upload_timeout_s must be positive")
        self.out = out
        self.rotate_s = float(rotate_s)
        self.system_interval_s = float(system_interval_s) if system_interval_s else None
        self.gpu = bool(gpu)
        self.worker_fetch = bool(worker_fetch)
        self.flush_s = float(flush_s)
        self.sidecar = bool(sidecar)
        self.upload_timeout_s = float(upload_timeout_s)
        self.stop_timeout_s = float(upload_timeout_s if stop_timeout_s is None else stop_timeout_s)
        self.node: str | None = None
        self.system_node: str | None = None
        self.capabilities = None
        self.sink_returncode: int | None = None
        self._active = False
        self._owner_pid = None
        self._buffer = _Buffer()
        self._hooks = None
        self._fd: int | None = None
        self._sink_process = None
        self._sink_thread = None
        self._flusher = None
        self._stop_event = threading.Event()
        # Re-entrant: stop() holds it (with a timeout) around the last flush and close, which take it too.
        self._send_lock = threading.RLock()
        self._spool_dir: str | None = None
        self._warned: set[str] = set()

    # -- public --------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._active

    @property
    def dropped_records(self) -> int:
        return self._buffer.dropped

    def start(self) -> "Collector":
        """Start recording; returns self. Warns (never raises) when it cannot."""
        global _ACTIVE
        with _ACTIVE_LOCK:
            if _ACTIVE is not None:
                self._warn("another collector is already recording in this process; this one records nothing")
                return self
            try:
                self._start()
            except Exception as exc:
                self._warn(f"not recording: {type(exc).__name__}: {exc}")
                self._cleanup_failed_start()
                return self
            _ACTIVE = self
        return self

    def stop(self) -> None:
        """Stop recording and finish the trial (waits for the sink, S3 uploads included)."""
        global _ACTIVE
        with _ACTIVE_LOCK:
            if not self._active or self._owner_pid != os.getpid():
                return
            self._active = False
            if _ACTIVE is self:
                _ACTIVE = None
        try:
            atexit.unregister(self._at_exit)
        except Exception:
            pass
        if self._hooks is not None:
            self._hooks.uninstall()
        self._stop_event.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join(10)
        # A sink that stopped reading (a hung disk) must not hang the end of training.
        if not self._send_lock.acquire(timeout=30):
            self._warn(f"the sink does not read its input; the trial in {self.out} may be incomplete")
            return
        try:
            self._flush()
            self._close_stream()
        finally:
            self._send_lock.release()
        self._wait_for_sink()

    def __enter__(self) -> "Collector":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- starting ------------------------------------------------------------------
    def _start(self) -> None:
        import torch  # noqa: F401  (the hooks need it; fail here, not in the loop)

        from .hooks import Hooks, inspect_torch

        self.capabilities = inspect_torch()
        for message in self.capabilities.warnings:
            self._warn(message)
        if not self.capabilities.getnext:
            raise RuntimeError("this torch's DataLoader has no hook points the collector knows")
        if not self.out.startswith("s3://"):
            os.makedirs(self.out, exist_ok=True)
            if not os.access(self.out, os.W_OK):
                raise PermissionError(f"{self.out} is not writable")
        identity = identify()
        self.node, self.system_node = identity.node, identity.system_node
        self._spool_dir = tempfile.mkdtemp(prefix="dashboard-collector-spool-")
        from .sink import SinkConfig

        config = SinkConfig(out=self.out, node=self.node, system_node=self.system_node,
                            start_us=time.time_ns() // 1000, main_pid=os.getpid(), spool_dir=self._spool_dir,
                            rotate_s=self.rotate_s, system_interval_s=self.system_interval_s, gpu=self.gpu,
                            tick_s=min(0.5, self.flush_s), upload_timeout_s=self.upload_timeout_s,
                            rank=identity.rank, local_rank=identity.local_rank)
        self._start_sink(config)
        self._owner_pid = os.getpid()
        self._buffer = _Buffer()
        self._hooks = Hooks(self, self.capabilities)
        self._hooks.install()
        self._active = True
        self._stop_event.clear()
        self._flusher = threading.Thread(target=self._flush_loop, name="dashboard-collector-flush", daemon=True)
        self._flusher.start()
        atexit.register(self._at_exit)

    def _start_sink(self, config) -> None:
        read_fd, write_fd = os.pipe()
        try:
            if self.sidecar and sys.executable:
                code = (f"import sys; sys.path.insert(0, {_package_root()!r}); "
                        "from dashboard.collector.sink import main; sys.exit(main())")
                self._sink_process = subprocess.Popen(
                    [sys.executable, "-c", code, config.to_json()], stdin=read_fd,
                    stdout=subprocess.DEVNULL, close_fds=True, start_new_session=True)
                os.close(read_fd)
            else:
                from .sink import run_sink

                def run():
                    self.sink_returncode = run_sink(config, read_fd)
                    os.close(read_fd)

                self._sink_thread = threading.Thread(target=run, name="dashboard-collector-sink", daemon=True)
                self._sink_thread.start()
        except Exception:
            os.close(read_fd)
            os.close(write_fd)
            raise
        self._fd = write_fd

    def _cleanup_failed_start(self) -> None:
        if self._hooks is not None:
            self._hooks.uninstall()
        self._active = False
        self._close_stream()
        if self._sink_process is not None or self._sink_thread is not None:
            self._wait_for_sink()
        if self._spool_dir:
            shutil.rmtree(self._spool_dir, ignore_errors=True)

    # -- the stream ------------------------------------------------------------------
    def _flush_loop(self) -> None:
        while not self._stop_event.wait(self.flush_s):
            self._flush()

    def _flush(self) -> None:
        try:
            data = self._buffer.drain()
            if self._buffer.dropped:
                self._warn("the sink cannot keep up; some GetNext records were dropped")
            if data:
                with self._send_lock:
                    self._send(data)
        except OSError as exc:
            self._fail(f"the sink stopped ({exc}); recording stops, training goes on")
        except Exception as exc:
            self._fail(f"recording failed ({type(exc).__name__}: {exc}); recording stops, training goes on")

    def _send(self, data: bytes) -> None:
        """Write to the sink; the caller holds _send_lock."""
        if self._fd is None:
            return
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def _close_stream(self) -> None:
        with self._send_lock:
            if self._fd is None:
                return
            try:
                os.write(self._fd, protocol.frame(protocol.QUIT))
            except OSError:
                pass
            self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def _wait_for_sink(self) -> None:
        if self._sink_process is not None:
            try:
                self.sink_returncode = self._sink_process.wait(self.stop_timeout_s + 30)
            except subprocess.TimeoutExpired:
                self._warn(f"the sink is still finishing {self.out} after {self.stop_timeout_s + 30:.0f} s; "
                           "it goes on in the background")
                return
        elif self._sink_thread is not None:
            self._sink_thread.join(self.stop_timeout_s + 30)
            if self._sink_thread.is_alive():
                return
        if self._spool_dir:  # the sink removes it; not when it died
            shutil.rmtree(self._spool_dir, ignore_errors=True)
        if self.sink_returncode:
            self._warn(f"the sink exited with status {self.sink_returncode}: the trial in {self.out} "
                       "may be incomplete (see the messages above)")

    def _fail(self, message: str) -> None:
        """Stop recording after a failure of our own; training goes on."""
        self._warn(message)
        if self._hooks is not None:
            self._hooks.uninstall()
        self._stop_event.set()
        self._buffer.clear()
        with self._send_lock:
            self._close_fd()

    def _warn(self, message: str) -> None:
        if message in self._warned:
            return
        self._warned.add(message)
        try:
            warnings.warn(f"dashboard.collector: {message}", CollectorWarning, stacklevel=3)
        except Exception:  # warnings turned into errors must not reach the loop either
            pass

    def _at_exit(self) -> None:
        if self._owner_pid == os.getpid():
            self.stop()

    # -- in a forked child (DataLoader workers, user forks) ------------------------------
    def _abandon_in_child(self) -> None:
        """The child of a fork is not the recording process: undo the hooks there,
        forget the buffer, and let go of the stream without ending it."""
        self._active = False
        if self._hooks is not None:
            self._hooks.uninstall()
        # No locks here: another thread of the parent may have held them at the fork.
        del self._buffer.getnext[:]
        self._buffer._controls = []
        self._buffer._lock = threading.Lock()
        self._send_lock = threading.RLock()
        self._close_fd()
        self._sink_process = None
        self._sink_thread = None


_ACTIVE: Collector | None = None
_ACTIVE_LOCK = threading.RLock()


def _after_fork_in_child() -> None:
    global _ACTIVE, _ACTIVE_LOCK
    _ACTIVE_LOCK = threading.RLock()  # the parent's may have been held by another thread
    collector, _ACTIVE = _ACTIVE, None
    if collector is not None:
        try:
            collector._abandon_in_child()
        except Exception:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def profile_dataloaders(out: str, **options) -> Collector:
    """A Collector for `with`: records every DataLoader of this process into `out`."""
    return Collector(out, **options)


def start(out: str, **options) -> Collector:
    """Start recording into `out` (see Collector for the options); returns the collector."""
    return Collector(out, **options).start()


def stop() -> None:
    """Stop the collector started in this process, if any."""
    collector = _ACTIVE
    if collector is not None:
        collector.stop()


def active_collector() -> Collector | None:
    return _ACTIVE
