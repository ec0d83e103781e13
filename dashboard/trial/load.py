"""Loading a trial: list its files, read and parse them concurrently, build the frames."""
from __future__ import annotations

from .. import arrow_memory  # noqa: F401  (before pandas and pyarrow: see there)

import hashlib
import os
import posixpath
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, MutableMapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .. import format as fmt
from . import frames
from .errors import FileOutsideTrialError, NotAFileError, NotATrialError, TrialError, TrialTooLargeError, size_text
from .kineto_format import NOT_RECORDED as KINETO_NOT_RECORDED
from .kineto_format import is_kineto_key, parse_kineto_pieces
from .smdebug_format import (MAX_EVENT_BEFORE_FILE_US, ParsedFile, decompress, duration_text,
                             parse_system_file, parse_trace_file, time_text)
from .store import READ_THREADS, FileInfo, S3Store, Store, fingerprint, open_store

FRAMEWORK, SYSTEM = "framework", "system"
KINETO = "kineto"  # a torch.profiler trace: framework rows, node read from the file
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class SkippedFile:
    path: str
    reason: str
    transient: bool = False  # a file that may read next time (see ParsedFile.transient)


@dataclass
class LoadReport:
    """What was read and what was skipped, and why. Skips are reported, never silent."""
    files_read: int = 0
    files_skipped: list[SkippedFile] = field(default_factory=list)
    lines_skipped: int = 0
    # Files read with some lines skipped: (path, reason).
    files_with_skipped_lines: list[SkippedFile] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether every file the listing named was read or skipped for good (a bad file, not
        one missing or unreadable at the moment): only a complete load is worth caching."""
        return not any(skipped.transient for skipped in self.files_skipped)

    def to_dict(self) -> dict:
        return {"read": self.files_read,
                "skipped": [{"path": s.path, "reason": s.reason} for s in self.files_skipped]}


@dataclass
class Trial:
    """A loaded trial: the canonical frames plus what loading them skipped."""
    path: str
    framework: pd.DataFrame
    system: pd.DataFrame
    report: LoadReport
    fingerprint: str = ""
    format: str = "smdebug"  # smdebug | kineto | mixed
    # Framework nodes read from Kineto traces, which lack KINETO_NOT_RECORDED.
    kineto_nodes: tuple[str, ...] = ()

    @property
    def not_recorded(self) -> tuple[str, ...]:
        """What the profiler did not record on some node ("initialization", "workers",
        "worker_id" for Kineto traces): to be shown as unknown, never as zero."""
        return KINETO_NOT_RECORDED if self.kineto_nodes else ()

    @property
    def nodes(self) -> list[str]:
        names = set(self.framework["node"].unique()) | set(self.system["node"].unique())
        return sorted(str(n) for n in names if isinstance(n, str))

    @property
    def start_us(self) -> int | None:
        starts = [s for s in (self.framework["start_us"].min() if len(self.framework) else None,
                              self.system["timestamp_us"].min() if len(self.system) else None)
                  if s is not None]
        return int(min(starts)) if starts else None

    @property
    def end_us(self) -> int | None:
        ends = [e for e in (self.framework["end_us"].max() if len(self.framework) else None,
                            self.system["timestamp_us"].max() if len(self.system) else None)
                if e is not None]
        return int(max(ends)) if ends else None

    def for_node(self, node: str | None) -> "Trial":
        """The part of the trial recorded on one node (a framework node id or a host)."""
        if not node:
            return self
        fw_nodes = self.framework["node"].astype(str)
        fw_mask = (fw_nodes == node) | (fw_nodes.map(host_of) == node)
        sys_nodes = self.system["node"].astype(str)
        sys_mask = (sys_nodes == node) | (sys_nodes == host_of(node))
        return Trial(self.path, self.framework[fw_mask].reset_index(drop=True),
                     self.system[sys_mask].reset_index(drop=True), self.report,
                     self.fingerprint, self.format,
                     tuple(n for n in self.kineto_nodes if n == node or host_of(n) == node))


def host_of(node: str) -> str:
    """The host of a framework node id: '20557-algo-1' -> 'algo-1'."""
    head, sep, rest = node.partition("-")
    return rest if sep and head.isdigit() else node


def classify_key(key: str) -> tuple[str, str] | None:
    """(FRAMEWORK | SYSTEM, node) for a file of the trial format, (KINETO, key) for a
    torch.profiler trace anywhere in the trial (its node is inside it), else None."""
    if is_kineto_key(key):
        return KINETO, key
    base = posixpath.basename(key)
    if key.startswith(fmt.FRAMEWORK_DIR + "/"):
        match = fmt.FRAMEWORK_FILE_RE.match(base) or fmt.FRAMEWORK_TMP_RE.match(base)
        if match:
            return FRAMEWORK, match.group("node")
    if key.startswith("system/"):
        match = fmt.SYSTEM_FILE_RE.match(base)
        if match:
            return SYSTEM, match.group("node")
    return None


def name_time_us(key: str, kind: str) -> int | None:
    """The time the name of a trial file of this kind carries (a framework file's end, a system
    file's minute), in epoch microseconds; None for a name without one (a .tmp framework file)."""
    base = posixpath.basename(key)
    if kind == FRAMEWORK:
        match = fmt.FRAMEWORK_FILE_RE.match(base)
        return int(match.group("end_us")) if match else None
    match = fmt.SYSTEM_FILE_RE.match(base) if kind == SYSTEM else None
    return int(match.group("epoch_s")) * 1_000_000 if match else None


_PARSE_SLOTS = threading.BoundedSemaphore(os.cpu_count() or 2)
_PARSERS = {FRAMEWORK: parse_trace_file, SYSTEM: parse_system_file}


class _LoadGuard:
    """Shared by the read threads of one load: the size and event limits, and the first
    error, after which no more files are read."""

    def __init__(self, path: str, max_bytes: int | None, max_events: int | None):
        self.path, self.max_bytes, self.max_events = path, max_bytes, max_events
        self._lock = threading.Lock()
        self._bytes = self._events = 0
        self._digests: set[bytes] = set()
        self.error: BaseException | None = None

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def fail(self, error: BaseException) -> None:
        with self._lock:
            self.error = self.error or error

    def add_bytes(self, count: int) -> None:
        with self._lock:
            self._bytes += count
            over = self.max_bytes is not None and self._bytes > self.max_bytes
        if over:
            self.too_large(f"trial is over the limit of {size_text(self.max_bytes)} once decompressed")

    def add_events(self, digest: bytes, count: int) -> None:
        """Counts a file's events once, however many copies of it the trial holds."""
        with self._lock:
            if digest in self._digests:
                return
            self._digests.add(digest)
            self._events += count
            over = self.max_events is not None and self._events > self.max_events
        if over:
            self.too_large(f"trial holds more than the limit of {self.max_events:,} events "
                           f"(framework events and system samples)")

    def too_large(self, why: str) -> None:
        error = TrialTooLargeError(f"{self.path}: {why}")
        self.fail(error)
        raise error


@dataclass(frozen=True)
class _ParsedEntry:
    """A file's parse, kept in a load's file_cache for the next load of the same trial."""
    parsed: ParsedFile
    digest: bytes
    nbytes: int  # as counted against max_bytes


# Names the parsers' rules in file_cache keys: a parse kept by a reader with other rules (2: events
# far from their file's time are skipped) is not taken for one of this reader's.
_PARSE_RULES = 2


def _file_cache_key(path: str, info: FileInfo) -> str:
    """Names one version of one file of one trial (`path`: the store's canonical_path, one
    name however the trial was spelled): a file whose size or version (ETag, mtime) changed is
    another entry."""
    identity = f"{path}\0{info.key}\0{info.size}\0{info.version}\0{_PARSE_RULES}".encode()
    return "parsed:" + hashlib.sha256(identity).hexdigest()


def _cached_parse(file_cache: MutableMapping, cache_key: str) -> _ParsedEntry | None:
    try:
        entry = file_cache.get(cache_key)
    except Exception:  # noqa: BLE001 - an entry an older version pickled, or a damaged one: read the file
        return None
    return entry if isinstance(entry, _ParsedEntry) else None


def _unreadable(exc: OSError) -> ParsedFile:
    """A file that could not be read now (removed or rewritten since the listing, no permission,
    an I/O error): skipped, and the load is not complete."""
    return ParsedFile(None, error=f"cannot read: {exc.strerror or exc}", transient=True)


class _Counted:
    """A file's pieces as they are read: counted against max_bytes, and digested."""

    def __init__(self, pieces: Iterable[bytes], guard: _LoadGuard):
        self.pieces, self.guard = pieces, guard
        self.digest, self.nbytes = hashlib.sha256(), 0

    def __iter__(self) -> Iterator[bytes]:
        for piece in self.pieces:
            self.nbytes += len(piece)
            self.guard.add_bytes(len(piece))
            self.digest.update(piece)
            yield piece


def _parse_one(store: Store, info: FileInfo, kind: str, node: str, guard: _LoadGuard,
               file_cache: MutableMapping | None, cache_key: str | None,
               ) -> tuple[ParsedFile, bytes | None, _ParsedEntry | None]:
    """The parsed file, a digest of its content (None when it could not be read), and what
    to keep in file_cache once the whole load succeeds (None: nothing new worth keeping)."""
    guard.check()  # another file failed the load: read no more
    key = info.key
    try:
        entry = _cached_parse(file_cache, cache_key) if cache_key is not None else None
        if entry is not None:  # unchanged since a load that read it: not read again
            guard.add_bytes(entry.nbytes)
            guard.add_events(entry.digest, entry.parsed.rows)
            return entry.parsed, entry.digest, None
        try:
            # Kineto traces run to GBs: read, counted, digested and scanned piece by piece. No
            # file is read past the size the listing saw (a growing file, as listed).
            source = (store.iter_chunks(key, size=info.size) if kind == KINETO
                      else store.read(key, size=info.size))
        except FileOutsideTrialError:
            return ParsedFile(None, error="refused: links outside the trial folder"), None, None
        except NotAFileError as exc:
            return ParsedFile(None, error=f"refused: {exc}"), None, None
        except OSError as exc:
            return _unreadable(exc), None, None
        if kind == KINETO:
            counted = _Counted(source, guard)
            with _PARSE_SLOTS:  # (reading included: the pieces are scanned as they come)
                guard.check()
                try:
                    parsed = parse_kineto_pieces(counted, key)
                except OSError as exc:
                    return _unreadable(exc), None, None
            if parsed.error:  # the file may not have been read to its end: no digest of it
                return parsed, None, None
            digest, nbytes = counted.digest.digest(), counted.nbytes
        else:
            try:
                data = decompress(key, source, max_size=guard.max_bytes)
            except (OSError, EOFError, zlib.error) as exc:
                return ParsedFile(None, error=f"not a valid gzip file ({exc})"), None, None
            except TrialTooLargeError as exc:
                guard.too_large(str(exc))
            del source
            if not data.strip():
                return ParsedFile(None, error="empty file"), None, None
            nbytes = len(data)
            guard.add_bytes(nbytes)
            digest = hashlib.sha256(data).digest()
            # Reads may wait on the network in many threads; parsing is CPU-bound, and running more
            # parses than cores at once only multiplies the memory held by half-parsed files.
            with _PARSE_SLOTS:
                guard.check()
                parsed = _PARSERS[kind](data, node, name_time_us(key, kind))
            del data
        guard.add_events(digest, parsed.rows)
        # Only files with events are worth keeping: the rest are cheap to read again.
        keep = _ParsedEntry(parsed, digest, nbytes) if cache_key is not None and parsed.table is not None else None
        return parsed, digest, keep
    except TrialError as exc:  # S3 unreachable, access denied, over a limit: fails the load
        guard.fail(exc)
        raise


# How far from the trial's median time an event may lie: a trial is one job, and a job lasts a
# month at most (MAX_EVENT_BEFORE_FILE_US: SageMaker's 28-day limit), wherever its median is.
# Each file's events are checked against the file's own time already; this catches a file whose
# every time is wrong, and its name's too: a host whose clock is off, or one wrong event that the
# writer's hour rotation put in a file of its own.
MAX_EVENT_FROM_TRIAL_US = MAX_EVENT_BEFORE_FILE_US


def _near_the_trial(read: list[tuple[str, str, pa.Table]], report: LoadReport) -> dict[str, list]:
    """The tables by kind, without the rows far from the trial's median time; those are
    counted in the report's skipped lines of their file.

    The median is weighted by rows over the files' own medians: most of the trial's events
    decide it, and no column of the whole trial is copied to find it."""
    tables: dict[str, list] = {FRAMEWORK: [], SYSTEM: [], KINETO: []}
    read = [(key, kind, table) for key, kind, table in read if table.num_rows]
    if not read:
        return tables
    medians = np.array([np.median(table.column("timestamp_us" if kind == SYSTEM else "end_us").to_numpy())
                        for _, kind, table in read])
    rows = np.array([table.num_rows for _, _, table in read])
    order = np.argsort(medians, kind="stable")
    middle = np.searchsorted(np.cumsum(rows[order]), rows.sum() / 2)
    center = int(medians[order][middle])
    # int64 bounds: compared with a float, Arrow would cast the times to float64 and refuse those
    # beyond 2**53 (year 2255).
    low, high = (pa.scalar(center + offset, pa.int64()) for offset in (-MAX_EVENT_FROM_TRIAL_US,
                                                                         MAX_EVENT_FROM_TRIAL_US))
    reasons = {item.path: index for index, item in enumerate(report.files_with_skipped_lines)}
    for key, kind, table in read:
        if kind == SYSTEM:
            start = end = table.column("timestamp_us")
        else:
            start, end = table.column("start_us"), table.column("end_us")
        near = pc.and_(pc.greater_equal(start, low), pc.less_equal(end, high))
        far = table.num_rows - (pc.sum(near).as_py() or 0)
        if far:
            table = table.filter(near)
            why = (f"{far} {'record' if kind == SYSTEM else 'event'}(s) more than "
                   f"{duration_text(MAX_EVENT_FROM_TRIAL_US)} from the trial's median time "
                   f"({time_text(center)})")
            report.lines_skipped += far
            if key in reasons:
                earlier = report.files_with_skipped_lines[reasons[key]]
                report.files_with_skipped_lines[reasons[key]] = SkippedFile(key, f"{earlier.reason}; {why}")
            else:
                report.files_with_skipped_lines.append(SkippedFile(key, why))
        if table.num_rows:
            tables[kind].append(table)
    return tables


def load_trial(path: str, *, roots: Sequence[str] | None = None, s3_client=None,
               s3_buckets: Sequence[str] | None = None, max_bytes: int | None = None,
               max_events: int | None = None, max_files: int | None = None, threads: int | None = None,
               on_progress: Progress | None = None, store: Store | None = None,
               files: list[FileInfo] | None = None, file_cache: MutableMapping | None = None) -> Trial:
    """Read a trial from a local folder or `s3://bucket/prefix`.

    Raises a TrialError subclass naming the path when the trial cannot be read; bad
    files and lines are skipped and listed in `trial.report`. A file with the same content
    as another (after gunzip) is read once; the copy is reported as skipped.

    max_bytes: refuse (TrialTooLargeError) a trial whose files hold more bytes, as listed
        or once decompressed. max_events: refuse a trial with more framework events and
        system samples; counted while parsing, so that the load stops early. max_files: refuse
        a trial whose listing holds more files (each costs a read and a parse however small).
    file_cache: a mapping (a dict, a diskcache.Cache) that keeps each file's parse between
        loads: a file whose size and version (ETag, mtime) are unchanged is taken from it, not
        read again, so that reloading a running job's trial reads only its new files.
    """
    store = store or open_store(path, roots=roots, s3_client=s3_client, s3_buckets=s3_buckets)
    files = store.list() if files is None else files
    if max_files is not None and len(files) > max_files:
        raise TrialTooLargeError(f"{path}: trial holds {len(files):,} files, over the limit of {max_files:,} files")
    if threads is None:
        # Local reads are quick, so more threads than cores only hold more files in memory;
        # S3 reads wait on the network, so they overlap many.
        threads = READ_THREADS if isinstance(store, S3Store) else (os.cpu_count() or 2)
    jobs, report = [], LoadReport()
    report.files_skipped += [SkippedFile(key, reason) for key, reason in store.skipped]
    for info in sorted(files, key=lambda f: f.key):
        found = classify_key(info.key)
        if found is None:
            report.files_skipped.append(SkippedFile(info.key, "not a trial file (unknown name or suffix)"))
        else:
            jobs.append((info, *found))
    if not jobs:
        raise NotATrialError(f"{path}: not a trial: no framework/pevents or system/incremental "
                             f"profiler files and no *.pt.trace.json(.gz) PyTorch profiler traces "
                             f"found ({len(files)} other file(s)"
                             + "".join(f"; {key}: {reason}" for key, reason in store.skipped[:3]) + ")")
    total_bytes = sum(info.size for info, _, _ in jobs)
    if max_bytes is not None and total_bytes > max_bytes:
        raise TrialTooLargeError(f"{path}: trial is {size_text(total_bytes)}, over the limit of "
                                 f"{size_text(max_bytes)}")

    read: list[tuple[str, str, pa.Table]] = []  # (key, kind, table) of each file read with rows
    guard = _LoadGuard(path, max_bytes, max_events)
    first_copy: dict[bytes, str] = {}  # content digest -> key of the first file holding it
    fresh: dict[str, _ParsedEntry] = {}  # parses new to file_cache
    pool = ThreadPoolExecutor(max_workers=max(1, min(threads, len(jobs))))
    # A .tmp file is still being written: its next version is another one, never worth keeping.
    cache_keys = [_file_cache_key(store.canonical_path, info)
                  if file_cache is not None and not info.key.endswith(".tmp") else None for info, _, _ in jobs]
    futures = [pool.submit(_parse_one, store, info, kind, node, guard, file_cache, cache_key)
               for (info, kind, node), cache_key in zip(jobs, cache_keys)]
    try:
        for done, ((info, kind, _), cache_key, future) in enumerate(zip(jobs, cache_keys, futures), 1):
            # A TrialError (S3 gone, access denied, over a limit) fails the load.
            parsed, digest, keep = future.result()
            if keep is not None:
                fresh[cache_key] = keep
            original = first_copy.setdefault(digest, info.key) if digest is not None else info.key
            if original != info.key:
                report.files_skipped.append(SkippedFile(info.key, f"duplicate of {original}"))
            elif parsed.error:
                report.files_skipped.append(SkippedFile(info.key, parsed.error, parsed.transient))
            else:
                report.files_read += 1
                if parsed.table is not None:
                    read.append((info.key, kind, parsed.table))
            if parsed.lines_skipped and original == info.key:
                report.lines_skipped += parsed.lines_skipped
                report.files_with_skipped_lines.append(
                    SkippedFile(info.key, "; ".join(parsed.problems) or "bad lines"))
            if on_progress is not None:
                on_progress(done, len(jobs))
    except BaseException as exc:
        # Fail now: files not started are dropped, files in flight stop at their next step.
        guard.fail(exc if isinstance(exc, TrialError) else TrialError(f"{path}: load abandoned"))
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    # Kept only now that the whole load succeeded: a failed load leaves nothing behind.
    for cache_key, keep in fresh.items():
        file_cache[cache_key] = keep
    fresh.clear()  # its entries hold the tables: let framework_frame free each as it converts it
    tables = _near_the_trial(read, report)
    read.clear()  # (as fresh: framework_frame frees each table as it converts it)
    kinds = {kind for _, kind, _ in jobs}
    trial_format = "kineto" if kinds == {KINETO} else "mixed" if KINETO in kinds else "smdebug"
    kineto_nodes = sorted({node for table in tables[KINETO]
                           for node in table.column("node").unique().to_pylist()})
    trial = Trial(path=path, framework=frames.framework_frame(tables[FRAMEWORK] + tables[KINETO]),
                  system=frames.system_frame(tables[SYSTEM]), report=report,
                  fingerprint=fingerprint(files), format=trial_format, kineto_nodes=tuple(kineto_nodes))
    arrow_memory.release_unused()
    return trial
