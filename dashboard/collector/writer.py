"""Writes trials in the reference format: rotated Chrome-trace framework files and
JSON-lines system-metric files.

Standard library only (runs inside training jobs). Files are written as `.tmp` and
renamed into place when closed, so a reader never sees a half-written closed file;
`on_close(key, local_path)` lets a caller ship each closed file (e.g. to S3).
Rotation follows the reference: every `rotate_s` seconds of event time, at
`max_bytes`, or when the UTC hour changes.

A framework file is `[`, the start-time metadata, then one `,`-separated event per
line, and `]` on close: a closed file is strict JSON (the reference's reader uses
`json.load`), and a `.tmp` file being written is every event so far minus the `]`.
Phase trace pids are stable for the writer's lifetime (every file re-declares the
phases seen so far), so a caller can pre-format events with `phase_pid()` and hand
them over in bulk with `write_events()`.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Callable, Iterable, Mapping

from .. import format as fmt

OnClose = Callable[[str, str], None]

_dumps = json.JSONEncoder(separators=(", ", ": "), allow_nan=False).encode


class TraceWriter:
    """One node's framework trace (`<node>_pythontimeline.json`), rotated."""

    def __init__(self, out_dir: str, node: str, start_time_us: int | None = None,
                 rotate_s: float = 60.0, max_bytes: int = 10_000_000,
                 on_close: OnClose | None = None, phases: Iterable[str] = ()):
        self.out_dir = out_dir
        self.node = node
        self.start_time_us = int(start_time_us if start_time_us is not None else time.time() * 1e6)
        self.rotate_us = int(rotate_s * 1e6)
        self.max_bytes = max_bytes
        self.on_close = on_close
        self._lock = threading.Lock()
        self._file = None
        # phase -> trace pid, stable across files (pid 0 carries the start time).
        self._phase_pids: dict[str, int] = {}
        for phase in phases:
            self._phase_pids.setdefault(phase, len(self._phase_pids) + 1)
        self._opened_us = 0
        self._end_us = 0
        self._bytes = 0
        self._hour = ""
        self.closed_keys: list[str] = []

    # -- writing -------------------------------------------------------------------
    def complete(self, phase: str, name: str, start_us: int, end_us: int,
                 args: Mapping | None = None) -> None:
        """Record one complete ("X") event; times are absolute epoch microseconds."""
        with self._lock:
            self._rotate_if_due(start_us, end_us)
            if self._file is None:
                self._open(start_us)
            pid = self._pid_of(phase)
            self._write(',\n{"name": %s, "pid": %d, "ph": "X", "ts": %d, "dur": %d, "args": %s}'
                        % (_dumps(name), pid, start_us - self.start_time_us, max(0, end_us - start_us),
                           _dumps(dict(args or {}))))
            self._end_us = max(self._end_us, end_us)

    def phase_pid(self, phase: str) -> int:
        """The trace pid of a phase in every file this writer writes."""
        with self._lock:
            return self._pid_of(phase)

    def write_events(self, text: str, first_start_us: int, last_end_us: int) -> None:
        """Append pre-formatted events: each `,\n{...}` with `ts` relative to
        `start_time_us` and `pid` from `phase_pid()`. Rotates on size only: time
        rotation is the caller's `rotate_if_due` (events may arrive late, e.g. a worker's
        lifetime when it ends, and must not close a file that just opened)."""
        if not text:
            return
        with self._lock:
            if self._file is None:
                self._open(first_start_us)
            self._write(text)
            self._end_us = max(self._end_us, last_end_us)
            if self._bytes >= self.max_bytes:
                self._close()

    def rotate_if_due(self, now_us: int | None = None) -> None:
        """Close the current file if its interval has passed (call from a timer)."""
        now_us = int(now_us if now_us is not None else time.time() * 1e6)
        with self._lock:
            self._rotate_if_due(now_us, now_us)

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._close()

    # -- internals -----------------------------------------------------------------
    def _tmp_path(self) -> str:
        return os.path.join(self.out_dir, fmt.framework_tmp_key(self.node))

    def _pid_of(self, phase: str) -> int:
        pid = self._phase_pids.get(phase)
        if pid is None:
            pid = len(self._phase_pids) + 1
            self._phase_pids[phase] = pid
            if self._file is not None:
                self._write(self._phase_line(phase, pid))
        return pid

    @staticmethod
    def _phase_line(phase: str, pid: int) -> str:
        return ',\n{"name": "process_name", "ph": "M", "pid": %d, "args": {"name": %s}}' % (pid, _dumps(phase))

    def _write(self, text: str) -> None:
        self._file.write(text)
        self._bytes += len(text)

    def _open(self, first_us: int) -> None:
        path = self._tmp_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._file = open(path, "w", encoding="utf-8")
        self._opened_us = first_us
        self._end_us = first_us
        self._hour = fmt.hour_folder(first_us)
        self._bytes = 0
        self._write('[\n{"name": "process_name", "ph": "M", "pid": 0, "args": {"%s": %d}}'
                    % (fmt.ARG_START_TIME, self.start_time_us))
        self._write("".join(self._phase_line(phase, pid) for phase, pid in self._phase_pids.items()))

    def _rotate_if_due(self, start_us: int, end_us: int) -> None:
        if self._file is None:
            return
        if (start_us - self._opened_us >= self.rotate_us or self._bytes >= self.max_bytes
                or fmt.hour_folder(start_us) != self._hour):
            self._close()

    def _close(self) -> None:
        if self._file is None:
            return
        self._file.write("\n]\n")
        self._file.close()
        self._file = None
        key = fmt.framework_file_key(self._end_us, self.node)
        final = os.path.join(self.out_dir, key)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        os.replace(self._tmp_path(), final)
        self.closed_keys.append(key)
        if self.on_close is not None:
            self.on_close(key, final)


class SystemMetricsWriter:
    """One node's system metrics, one JSON-lines file per `rotate_s` (a minute)."""

    def __init__(self, out_dir: str, node: str, rotate_s: float = 60.0,
                 on_close: OnClose | None = None):
        self.out_dir = out_dir
        self.node = node
        self.rotate_s = int(rotate_s)
        self.on_close = on_close
        self._lock = threading.Lock()
        self._file = None
        self._epoch_s = 0
        self.closed_keys: list[str] = []

    def write(self, records: Iterable[tuple[str, str, str, float, float]]) -> None:
        """records: (type, name, dimension, value, timestamp_s) tuples of one sample."""
        with self._lock:
            for mtype, name, dimension, value, ts in records:
                bucket = int(ts) - int(ts) % self.rotate_s
                if self._file is not None and bucket != self._epoch_s:
                    self._close()
                if self._file is None:
                    self._open(bucket)
                self._file.write(_dumps({"Type": mtype, "Name": name, "Dimension": dimension,
                                         "Value": value, "NodeId": self.node, "Timestamp": ts}) + "\n")

    def rotate_if_due(self, now_s: float | None = None) -> None:
        now_s = time.time() if now_s is None else now_s
        with self._lock:
            if self._file is not None and now_s - self._epoch_s >= self.rotate_s:
                self._close()

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _final_key(self) -> str:
        return fmt.system_file_key(self._epoch_s, self.node)

    def _open(self, epoch_s: int) -> None:
        self._epoch_s = epoch_s
        path = os.path.join(self.out_dir, self._final_key()) + ".tmp"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")

    def _close(self) -> None:
        if self._file is None:
            return
        self._file.close()
        self._file = None
        key = self._final_key()
        final = os.path.join(self.out_dir, key)
        os.replace(final + ".tmp", final)
        self.closed_keys.append(key)
        if self.on_close is not None:
            self.on_close(key, final)
