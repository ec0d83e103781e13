"""Loading a trial: list its files, read and parse them concurrently, build the frames."""
from __future__ import annotations

from .. import arrow_memory  # noqa: F401  (before pandas and pyarrow: see there)

import dataclasses
import hashlib
import os
import posixpath
import threading
import zlib
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, MutableMapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .. import format as fmt
from ..display import iso_utc
from . import frames
from .errors import FileOutsideTrialError, NotAFileError, NotATrialError, TrialError, TrialTooLargeError, size_text
from .kineto_format import NOT_RECORDED as KINETO_NOT_RECORDED
from .kineto_format import JSON_FILE_RE, NOT_A_TRACE, is_kineto_key, parse_kineto_pieces
from .null_columns import with_null_columns, without_null_columns
from .smdebug_format import (MAX_EVENT_BEFORE_FILE_US, ParsedFile, broken_off, decompress, duration_text,
                             parse_system_file, parse_trace_file)
from .store import READ_THREADS, FileInfo, LocalStore, S3Store, Store, fingerprint, open_store
from .table_handover import TableHandover

FRAMEWORK, SYSTEM = "framework", "system"
CACHE_WRITERS = 4  # threads that write a load's new files to its file_cache
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
    files_skipped: list[SkippedFile] = field(default_factory=list)
    # Files read with some lines skipped or values ignored (ParsedFile.values_ignored): (path, reason).
    files_with_skipped_lines: list[SkippedFile] = field(default_factory=list)
    # Which files were read, and the lines skipped in each (the counts are read from them): a
    # report can be narrowed to some of its files (restricted_to), as per-rank work needs for
    # the files several ranks read.
    read_paths: list[str] = field(default_factory=list, repr=False)
    lines_skipped_by_path: dict[str, int] = field(default_factory=dict, repr=False)
    # Values read as missing in the events each file's parse kept (ParsedFile.values_ignored);
    # a file whose events all lay far from the trial's time (_near_the_trial) has none.
    values_ignored_by_path: dict[str, int] = field(default_factory=dict, repr=False)
    # Per file, what per-rank work checks across ranks as a whole load checks it across files:
    # its content's digest (duplicates), the bytes it counted (max_bytes), and its rows' times
    # (median, rows, earliest, latest) before the trial's median time kept those near it.
    digests: dict[str, bytes] = field(default_factory=dict, repr=False)
    bytes_by_path: dict[str, int] = field(default_factory=dict, repr=False)
    file_times: dict[str, tuple[int, int, int, int]] = field(default_factory=dict, repr=False)
    center_us: int | None = field(default=None, repr=False)  # that median time

    @property
    def files_read(self) -> int:
        return len(self.read_paths)

    @property
    def lines_skipped(self) -> int:
        return sum(self.lines_skipped_by_path.values())

    @property
    def values_ignored(self) -> int:
        return sum(self.values_ignored_by_path.values())

    @property
    def complete(self) -> bool:
        """Whether every file the listing named was read or skipped for good (a bad file, not
        one missing or unreadable at the moment): only a complete load is worth caching."""
        return not any(skipped.transient for skipped in self.files_skipped)

    def restricted_to(self, paths: set[str]) -> "LoadReport":
        """The report of these files alone."""
        read = [p for p in self.read_paths if p in paths]
        by_path = {p: n for p, n in self.lines_skipped_by_path.items() if p in paths}
        mine = lambda values: {p: v for p, v in values.items() if p in paths}  # noqa: E731
        return LoadReport([f for f in self.files_skipped if f.path in paths],
                          [f for f in self.files_with_skipped_lines if f.path in paths], read, by_path,
                          mine(self.values_ignored_by_path), mine(self.digests), mine(self.bytes_by_path),
                          mine(self.file_times), self.center_us)

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
    # Processes read from Kineto traces, which lack KINETO_NOT_RECORDED.
    kineto_processes: tuple[str, ...] = ()

    @property
    def not_recorded(self) -> tuple[str, ...]:
        """What the profiler did not record on some process ("initialization", "workers",
        "worker_id" for Kineto traces): to be shown as unknown, never as zero."""
        return KINETO_NOT_RECORDED if self.kineto_processes else ()

    @property
    def nodes(self) -> list[str]:
        """The hosts: of the framework events and of the system metrics."""
        names = set(self.framework["node"].unique()) | set(self.system["node"].unique())
        return sorted(str(n) for n in names if isinstance(n, str))

    @cached_property
    def processes(self) -> list[Process]:
        """The processes that recorded framework events, by host, then rank, then pid."""
        return processes_of(self.framework)

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

    def for_node(self, node: str | None = None, rank: int | None = None) -> "Trial":
        """The part of the trial recorded on one host, or by one process (`node` a process id,
        or `rank`), with its host's system metrics. A selection that matches nothing is empty."""
        if not node and rank is None:
            return self
        framework = self.framework
        if rank is not None:
            fw_mask = (framework["rank"] == rank).fillna(False).to_numpy(dtype=bool)
            if node:
                fw_mask &= ((framework["node"] == node) | (framework["process"] == node)).to_numpy()
        else:
            fw_mask = ((framework["node"] == node) | (framework["process"] == node)).to_numpy()
        part = framework[fw_mask].reset_index(drop=True)
        hosts = set(part["node"].unique()) if rank is not None or node not in self.nodes else {node}
        sys_mask = self.system["node"].isin(hosts).to_numpy()
        kept = set(part["process"].unique())
        return Trial(self.path, part, self.system[sys_mask].reset_index(drop=True), self.report,
                     self.fingerprint, self.format, tuple(p for p in self.kineto_processes if p in kept))


@dataclass(frozen=True)
class Process:
    """A process that recorded framework events: `id` as the reference names it."""
    node: str  # its host
    id: str
    pid: int | None
    rank: int | None
    local_rank: int | None

    @property
    def label(self) -> str:
        """'rank 3' in a distributed job, else 'pid 12118' (its host said apart)."""
        return (f"rank {self.rank}" if self.rank is not None else
                f"pid {self.pid}" if self.pid is not None else self.id)


def processes_of(framework: pd.DataFrame) -> list[Process]:
    """The processes of a framework frame; `pid` is the pid of its training-loop events (the
    worker processes record under their parent's id). One pass over the category codes."""
    if framework.empty:
        return []
    process = framework["process"]
    process = (process if process.dtype.name == "category" else process.astype("category")).array
    codes = process.codes
    main = framework["kind"].isin([fmt.KIND_GETNEXT, fmt.KIND_INIT, fmt.KIND_STEP]).to_numpy() & (codes >= 0)
    anywhere = codes >= 0
    first_main = dict(zip(*(lambda c, i: (c, np.flatnonzero(main)[i]))(*np.unique(codes[main], return_index=True))))
    first_any = dict(zip(*(lambda c, i: (c, np.flatnonzero(anywhere)[i]))(*np.unique(codes[anywhere],
                                                                                      return_index=True))))
    # Values read at a few rows (iat), not whole columns: the node column as an array is a
    # string per row (2.5 s at 3M GetNexts).
    node, pid, rank, local_rank = (framework[c] for c in ("node", "pid", "rank", "local_rank"))

    def known(value):
        return None if pd.isna(value) else int(value)

    out = []
    for code, row in first_any.items():
        at = first_main.get(code, row)
        out.append(Process(str(node.iat[row]), str(process.categories[code]), known(pid.iat[at]),
                           known(rank.iat[row]), known(local_rank.iat[row])))
    return sorted(out, key=process_order)


def process_order(process: Process) -> tuple:
    return frames.identity_order(process.node, process.rank, process.pid, process.id)


@dataclass(frozen=True)
class TrialFacts:
    """What a trial's results say of the trial itself, without its frames (report.to_dict
    reads these of a Trial too): per-rank work returns the facts of its share of the files,
    and merge_facts joins them."""
    path: str
    format: str
    processes: tuple[Process, ...]
    nodes: tuple[str, ...]
    report: LoadReport
    kineto_processes: tuple[str, ...]
    start_us: int | None
    end_us: int | None

    @property
    def not_recorded(self) -> tuple[str, ...]:
        return KINETO_NOT_RECORDED if self.kineto_processes else ()


def facts_of(trial: Trial) -> TrialFacts:
    return TrialFacts(trial.path, trial.format, tuple(trial.processes), tuple(trial.nodes), trial.report,
                      tuple(trial.kineto_processes), trial.start_us, trial.end_us)


def merge_facts(path: str, parts: Sequence[TrialFacts], report: LoadReport) -> TrialFacts:
    """The facts of a trial read in parts; `report` holds what the parts did not read (files no
    part was given), and gains theirs, files in path order."""
    for part in parts:
        report.files_skipped += part.report.files_skipped
        report.files_with_skipped_lines += part.report.files_with_skipped_lines
        report.read_paths += part.report.read_paths
        report.lines_skipped_by_path.update(part.report.lines_skipped_by_path)
        report.values_ignored_by_path.update(part.report.values_ignored_by_path)
        report.digests.update(part.report.digests)
        report.bytes_by_path.update(part.report.bytes_by_path)
        report.file_times.update(part.report.file_times)
    report.files_skipped.sort(key=lambda s: s.path)
    report.files_with_skipped_lines.sort(key=lambda s: s.path)
    formats = {part.format for part in parts}
    starts = [p.start_us for p in parts if p.start_us is not None]
    ends = [p.end_us for p in parts if p.end_us is not None]
    return TrialFacts(path, formats.pop() if len(formats) == 1 else "mixed",
                      tuple(sorted({p for part in parts for p in part.processes}, key=process_order)),
                      tuple(sorted({n for part in parts for n in part.nodes})), report,
                      tuple(sorted({p for part in parts for p in part.kineto_processes})),
                      min(starts) if starts else None, max(ends) if ends else None)


@dataclass(frozen=True)
class RankFiles:
    """The files of some of a trial's processes: their framework files and their hosts' system
    files, which load_trial(path, files=...) reads as a trial of its own."""
    processes: tuple[str, ...]
    files: tuple[FileInfo, ...]
    owned: frozenset[str]  # the keys whose report is this group's (a host's system files: one group's)


def rank_files(files: Sequence[FileInfo]) -> tuple[list[RankFiles], dict[str, int]]:
    """A trial's files by process, and how many processes each host has: one group per
    process whose framework files name it (the reference's <END_US>_<NODE>_... names), with
    its host's system files. A trial with torch.profiler traces (whose processes only their
    content names) or with files of no process is one group. ({}: the counts are unknown.)"""
    framework: dict[str, list[FileInfo]] = {}
    system: dict[str, list[FileInfo]] = {}
    for info in files:
        found = classify_key(info.key)
        if found is None:
            continue
        kind, name = found
        if kind == KINETO:
            return [_whole(files)], {}
        (framework if kind == FRAMEWORK else system).setdefault(name, []).append(info)
    if not framework:
        return [_whole(files)], {}
    hosts: dict[str, int] = {}
    for process in framework:
        hosts[frames.host_of(process)] = hosts.get(frames.host_of(process), 0) + 1
    groups, reported = [], set()
    for process, mine in sorted(framework.items()):
        host = frames.host_of(process)
        shared = system.get(host, [])
        owned = {info.key for info in mine} | (set() if host in reported else {info.key for info in shared})
        reported.add(host)
        groups.append(RankFiles((process,), tuple(mine) + tuple(shared), frozenset(owned)))
    # System files of a host without training processes: a group of their own.
    groups += [_whole(mine) for host, mine in sorted(system.items()) if host not in hosts]
    return groups, hosts


def _whole(files: Sequence[FileInfo]) -> RankFiles:
    mine = tuple(info for info in files if classify_key(info.key) is not None)  # the rest: not a task's
    return RankFiles((), mine, frozenset(info.key for info in mine))


def classify_key(key: str) -> tuple[str, str] | None:
    """(FRAMEWORK, process) or (SYSTEM, host) for a file of the trial format, (KINETO, key)
    for a torch.profiler trace anywhere in the trial (its identity is inside it) or any other
    JSON file (its content decides: parse_kineto_pieces refuses what is not a trace), else None."""
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
    if JSON_FILE_RE.search(key):
        return KINETO, key
    return None


NOT_A_TRIAL_FILE = "not a trial file (unknown name or suffix"  # (closed by the reason's end)
# What a path must hold to be a trial, for the message that says it holds none of it.
FORMATS_LOOKED_FOR = ("SageMaker Debugger profiler files (framework/pevents/.../<END_US>_<NODE>_pythontimeline.json, "
                      "system/incremental/.../<EPOCH_S>.<NODE>.json), or PyTorch profiler (Kineto) traces "
                      "(*.pt.trace.json[.gz], or any .json[.gz] file with traceEvents and Kineto's fields, "
                      "as export_chrome_trace and tensorboard_trace_handler write them)")


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
# A reference-format parse holds the GIL while msgspec builds its structs, so the reading threads
# decode one file at a time. Other cores parse only in forked processes (ForkedWorkers, where
# usable): forkserver and spawn workers re-run the caller's main module (a script without a
# __main__ guard fails) and import the parser, about 0.5 s each, more than two cores save on a
# 300k trial (bench/parse_speed.py); fork is unsafe in a process whose other threads hold locks
# (a server's requests), so a threaded server parses in its own process.


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
class ParsedEntry:
    """A file's parse, kept in a load's file_cache for the next load of the same trial."""
    parsed: ParsedFile
    digest: bytes
    nbytes: int  # as counted against max_bytes


# Names the parsers' rules in file_cache keys: a parse kept by a reader with other rules (2: events
# far from their file's time are skipped) is not taken for one of this reader's.
# 3: process ids and ranks; 4: NaN and Infinity read, then skipped as non-finite; 5: a Kineto
# trace's digest is of its decompressed bytes, its events found in any key order, a GetNext that
# spans its loader's next one skipped; a reference-format gzip cut short keeps its events.
# 6: values not of their field's type counted (ParsedFile.values_ignored). 7: events of no phase
# counted as bad; Chrome's object form, a BOM, gzip without .gz or with bytes after its stream read;
# a Kineto event with bytes that are not UTF-8 skipped alone; baseTimeNanoseconds in any number form;
# a file not one object per line read by its objects' braces where its lines are mostly broken.
_PARSE_RULES = 7


def _file_cache_key(path: str, info: FileInfo) -> str:
    """Names one version of one file of one trial (`path`: the store's canonical_path, one
    name however the trial was spelled): a file whose size or version (ETag; mtime and ctime) changed is
    another entry."""
    identity = f"{path}\0{info.key}\0{info.size}\0{info.version}\0{_PARSE_RULES}".encode()
    return "parsed:" + hashlib.sha256(identity).hexdigest()


def _cached_parse(file_cache: MutableMapping, cache_key: str) -> ParsedEntry | None:
    try:
        entry = file_cache.get(cache_key)
    except Exception:  # noqa: BLE001 - an entry an older version pickled, or a damaged one: read the file
        return None
    return entry if isinstance(entry, ParsedEntry) else None


def _unreadable(exc: OSError) -> ParsedFile:
    """A file that could not be read now (removed or rewritten since the listing, no permission,
    an I/O error): skipped, and the load is not complete."""
    return ParsedFile(None, error=f"cannot read: {exc.strerror or exc}", transient=True)


class _Counted:
    """A file's pieces as they are decompressed (`add`, given each in turn): digested, so that
    copies of one trace are one content however each was compressed (a .json and its .json.gz,
    two gzips of it with other headers), as a reference-format file's digest is of its bytes
    once decompressed; and counted against max_bytes (a gzip trace of 67 kB may hold 6 MB)."""

    def __init__(self, guard: _LoadGuard):
        self.guard = guard
        self.digest, self.nbytes = hashlib.sha256(), 0

    def add(self, decompressed: bytes) -> None:
        self.nbytes += len(decompressed)
        self.guard.add_bytes(len(decompressed))
        self.digest.update(decompressed)


def _parse_one(store: Store, info: FileInfo, kind: str, node: str, guard: _LoadGuard,
               file_cache: MutableMapping | None, cache_key: str | None, cluster=None,
               ) -> tuple[ParsedFile, bytes | None, ParsedEntry | None, int]:
    """The parsed file, a digest of its content (None when it could not be read), what
    to keep in file_cache once the whole load succeeds (None: nothing new worth keeping), and
    the bytes it counted against max_bytes.
    cluster: a dask.distributed Client whose workers read and parse the file (None: here)."""
    guard.check()  # another file failed the load: read no more
    try:
        entry = _cached_parse(file_cache, cache_key) if cache_key is not None else None
        if entry is not None:  # unchanged since a load that read it: not read again
            guard.add_bytes(entry.nbytes)
            guard.add_events(entry.digest, entry.parsed.rows)
            return entry.parsed, entry.digest, None, entry.nbytes
        if cluster is None:
            parsed, digest, nbytes = _read_and_parse(store, info, kind, node, guard)
        else:
            # The worker opens the trial itself (S3: its own credential chain) and counts the file
            # against max_bytes as it decompresses; the whole trial's count is kept here. A forked
            # worker on this host hands its table over through shared memory (ForkedWorkers.parse).
            parsed, digest, nbytes = (
                cluster.parse(store.canonical_path, info, kind, node, guard.max_bytes)
                if isinstance(cluster, ForkedWorkers) else
                cluster.submit(parse_file_for_client, store.canonical_path, info, kind, node, guard.max_bytes,
                               pure=False).result())
            parsed = _made_whole(parsed)
            guard.add_bytes(nbytes)
        if digest is None:
            return parsed, None, None, nbytes
        guard.add_events(digest, parsed.rows)
        # Only files with events are worth keeping: the rest are cheap to read again.
        keep = ParsedEntry(parsed, digest, nbytes) if cache_key is not None and parsed.table is not None else None
        return parsed, digest, keep, nbytes
    except TrialError as exc:  # S3 unreachable, access denied, over a limit: fails the load
        guard.fail(exc)
        raise


# A local trial this large is parsed in worker processes when the caller asks for them: the
# parse holds the GIL (msgspec, Arrow arrays from Python values), so threads do not overlap
# it. bench/parse_speed.py, the 300k trial's 88 MB on 2 cores: 1.02 s in one process, 1.12 s in
# 2 threads, 0.69 s in 2 forked processes; below this size starting them is most of the gain.
PROCESS_PARSE_MIN_BYTES = 32 << 20


class ForkedWorkers:
    """Worker processes for a command's work: reading and parsing a local trial's files
    (parse_file_for_client), or a rank's whole analysis (dashboard/by_rank.py), as a Dask
    cluster's workers would do it: work is submitted to either the same way. Forked, so that
    they start in milliseconds with the modules imported, and only from a process that runs no
    other thread (a fork copies the locks other threads hold, and the copy never unlocks):
    usable() says whether that holds now. A parse's table comes back through shared memory
    (table_handover.py), not pickled through the pool's pipe, where the host has it to spare."""

    def __init__(self, processes: int):
        self._pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("fork"))
        # Forks them all now, before the load starts its reading threads.
        self._pool.submit(int).result()
        self._handover = TableHandover.create()  # (None: the tables come back pickled)

    @staticmethod
    def usable() -> bool:
        return threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods()

    def submit(self, fn, *args, pure: bool = False):  # (pure: Dask's keyword, meaningless here)
        return self._pool.submit(fn, *args)

    def parse(self, path: str, info: FileInfo, kind: str, node: str, max_bytes: int | None,
              ) -> tuple[ParsedFile, bytes | None, int]:
        """parse_file_for_client in a worker, its table handed over through shared memory (still
        without its columns of nulls alone: _made_whole)."""
        parsed, name, digest, nbytes = self.submit(_parse_handing_over, self._handover, path, info, kind, node,
                                                   max_bytes).result()
        if name is None:
            return parsed, digest, nbytes
        try:
            return dataclasses.replace(parsed, table=self._handover.take(name)), digest, nbytes
        except OSError:  # its file is gone (a cleaner of /dev/shm): parsed again, here
            return parse_file_of_trial(path, info, kind, node, max_bytes)

    def shutdown(self) -> None:
        try:
            self._pool.shutdown(wait=True, cancel_futures=True)
        finally:
            if self._handover is not None:
                self._handover.close()


def _parse_handing_over(handover: TableHandover | None, path: str, info: FileInfo, kind: str, node: str,
                        max_bytes: int | None) -> tuple[ParsedFile, str | None, bytes | None, int]:
    """parse_file_for_client, in a forked worker: (parsed, name, digest, nbytes), the table left
    in the handover under that name (None: it is in parsed, as the pipe then carries it)."""
    parsed, digest, nbytes = parse_file_for_client(path, info, kind, node, max_bytes)
    name = handover.put(parsed.table) if handover is not None and parsed.table is not None else None
    return (parsed if name is None else dataclasses.replace(parsed, table=None)), name, digest, nbytes


def parse_file_of_trial(path: str, info: FileInfo, kind: str, node: str, max_bytes: int | None,
                        ) -> tuple[ParsedFile, bytes | None, int]:
    """Reads and parses one file of the trial at `path` (a store's canonical_path), as a Dask
    task on a worker: (parsed, digest, bytes counted), as _read_and_parse."""
    return _read_and_parse(open_store(path), info, kind, node, _LoadGuard(path, max_bytes, None))


def parse_file_for_client(path: str, info: FileInfo, kind: str, node: str, max_bytes: int | None,
                          ) -> tuple[ParsedFile, bytes | None, int]:
    """parse_file_of_trial in a worker of another process (a Dask task, a forked worker): its
    table without its columns of nulls alone, which the client makes again (_made_whole,
    null_columns.py): half of a reference trial's bytes on the wire."""
    parsed, digest, nbytes = parse_file_of_trial(path, info, kind, node, max_bytes)
    if parsed.table is not None:
        parsed = dataclasses.replace(parsed, table=without_null_columns(parsed.table))
    return parsed, digest, nbytes


def _made_whole(parsed: ParsedFile) -> ParsedFile:
    """A parse_file_for_client's file with its columns of nulls alone again, whichever way it
    came (shared memory, a pipe, Dask; any other file: as it is)."""
    return parsed if parsed.table is None else dataclasses.replace(parsed, table=with_null_columns(parsed.table))


def _read_and_parse(store: Store, info: FileInfo, kind: str, node: str, guard: _LoadGuard,
                    ) -> tuple[ParsedFile, bytes | None, int]:
    """(parsed, digest, nbytes): the file parsed, a digest of its content (None when it was not
    read whole), and the bytes counted against the guard's max_bytes."""
    key = info.key
    try:
        # Kineto traces run to GBs: read, counted, digested and scanned piece by piece. No
        # file is read past the size the listing saw (a growing file, as listed).
        source = (store.iter_chunks(key, size=info.size) if kind == KINETO
                  else store.read(key, size=info.size))
    except FileOutsideTrialError:
        return ParsedFile(None, error="refused: links outside the trial folder"), None, 0
    except NotAFileError as exc:
        return ParsedFile(None, error=f"refused: {exc}"), None, 0
    except OSError as exc:
        return _unreadable(exc), None, 0
    if kind == KINETO:
        counted = _Counted(guard)
        with _PARSE_SLOTS:  # (reading included: the pieces are scanned as they come)
            guard.check()
            try:
                parsed = parse_kineto_pieces(source, key, on_decoded=counted.add)
            except OSError as exc:
                return _unreadable(exc), None, counted.nbytes
        if parsed.error:  # the file may not have been read to its end: no digest of it
            return parsed, None, counted.nbytes
        return parsed, counted.digest.digest(), counted.nbytes
    try:
        data, broke_off = decompress(key, source, max_size=guard.max_bytes)
    except (OSError, EOFError, zlib.error) as exc:
        return ParsedFile(None, error=f"not a valid gzip file ({exc})"), None, 0
    except TrialTooLargeError as exc:
        guard.too_large(str(exc))
    del source
    if not data or data.isspace():  # (not data.strip(): a copy of every file to look at its ends)
        return ParsedFile(None, error="empty file"), None, 0
    nbytes = len(data)
    guard.add_bytes(nbytes)
    digest = hashlib.sha256(data).digest()
    # Reads may wait on the network in many threads; parsing is CPU-bound, and running more
    # parses than cores at once only multiplies the memory held by half-parsed files.
    with _PARSE_SLOTS:
        guard.check()
        parsed = _PARSERS[kind](data, node, name_time_us(key, kind))
    if broke_off:  # the events before the break are read; the break is a skipped line
        parsed = broken_off(parsed, data, broke_off)
    return parsed, digest, nbytes


# How far from the trial's median time an event may lie: a trial is one job, and a job lasts a
# month at most (MAX_EVENT_BEFORE_FILE_US: SageMaker's 28-day limit), wherever its median is.
# Each file's events are checked against the file's own time already; this catches a file whose
# every time is wrong, and its name's too: a host whose clock is off, or one wrong event that the
# writer's hour rotation put in a file of its own.
MAX_EVENT_FROM_TRIAL_US = MAX_EVENT_BEFORE_FILE_US


def trial_center(medians: Sequence[float], rows: Sequence[int]) -> int:
    """A trial's median time: weighted by rows over its files' own medians, so that most of
    the trial's events decide it, and no column of the whole trial is copied to find it."""
    medians, rows = np.asarray(medians, dtype=np.float64), np.asarray(rows)
    order = np.argsort(medians, kind="stable")
    middle = np.searchsorted(np.cumsum(rows[order]), rows.sum() / 2)
    return int(medians[order][middle])


def trial_bounds(center_us: int) -> tuple[int, int]:
    """The times near a trial centred at center_us: [low, high]. The load's filter and
    per-rank work's check (near_the_trial) both read them."""
    return center_us - MAX_EVENT_FROM_TRIAL_US, center_us + MAX_EVENT_FROM_TRIAL_US


def near_the_trial(center_us: int, low_us: int, high_us: int) -> bool:
    """Whether times from low_us to high_us all lie near a trial centred at center_us."""
    low, high = trial_bounds(center_us)
    return low <= low_us and high_us <= high


def _near_the_trial(read: list[tuple[str, str, pa.Table]], report: LoadReport,
                    center_us: int | None = None) -> dict[str, list]:
    """The tables by kind, without the rows far from the trial's median time (trial_center,
    unless the caller knows it: a rank's share of a trial is judged by the whole trial's);
    those are counted in the report's skipped lines of their file."""
    tables: dict[str, list] = {FRAMEWORK: [], SYSTEM: [], KINETO: []}
    read = [(key, kind, table) for key, kind, table in read if table.num_rows]
    if not read:
        return tables
    for key, kind, table in read:
        times = table.column("timestamp_us" if kind == SYSTEM else "end_us").to_numpy()
        starts = times if kind == SYSTEM else table.column("start_us").to_numpy()
        report.file_times[key] = (float(np.median(times)), table.num_rows, int(starts.min()), int(times.max()))
    center = center_us if center_us is not None else trial_center(
        [report.file_times[key][0] for key, _, _ in read], [table.num_rows for _, _, table in read])
    report.center_us = center
    # int64 bounds: compared with a float, Arrow would cast the times to float64 and refuse those
    # beyond 2**53 (year 2255).
    low, high = (pa.scalar(bound, pa.int64()) for bound in trial_bounds(center))
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
                   f"({iso_utc(center)})")
            report.lines_skipped_by_path[key] = report.lines_skipped_by_path.get(key, 0) + far
            if key in reasons:
                earlier = report.files_with_skipped_lines[reasons[key]]
                report.files_with_skipped_lines[reasons[key]] = SkippedFile(key, f"{earlier.reason}; {why}")
            else:
                report.files_with_skipped_lines.append(SkippedFile(key, why))
        if table.num_rows:
            tables[kind].append(table)
        else:  # none of the file's events kept: nor are their values ignored
            report.values_ignored_by_path.pop(key, None)
    return tables


def load_trial(path: str, *, roots: Sequence[str] | None = None, s3_client=None,
               s3_buckets: Sequence[str] | None = None, max_bytes: int | None = None,
               max_events: int | None = None, max_files: int | None = None, threads: int | None = None,
               on_progress: Progress | None = None, store: Store | None = None,
               files: list[FileInfo] | None = None, file_cache: MutableMapping | None = None,
               dask_client=None, processes: int | None = None, center_us: int | None = None) -> Trial:
    """Read a trial from a local folder or `s3://bucket/prefix`.

    Raises a TrialError subclass naming the path when the trial cannot be read; bad
    files and lines are skipped and listed in `trial.report`. A file with the same content
    as another (after gunzip) is read once; the copy is reported as skipped.

    max_bytes: refuse (TrialTooLargeError) a trial whose files hold more bytes, as listed
        or once decompressed. max_events: refuse a trial with more framework events and
        system samples; counted while parsing, so that the load stops early. max_files: refuse
        a trial whose listing holds more files (each costs a read and a parse however small).
    file_cache: a mapping that keeps each file's parse between loads: a file whose size and
        version (ETag; mtime and ctime) are unchanged is taken from it, not read again, so that reloading
        a running job's trial reads only its new files. A dict keeps them in this process; a
        columnar_cache.ColumnarFileCache as Arrow files that any process reads.
    dask_client: a dask.distributed Client: each file is read and parsed by a task on its
        cluster's workers, which open the trial themselves (an S3 trial with their own credential
        chain) and return Arrow tables. Without one, the scheduler DASHBOARD_DASK_SCHEDULER names,
        when set (dask_cluster.client_from_environment); else here, by the same code.
    center_us: the trial's median time, when this load reads only some of its files (a rank's
        share, dashboard/by_rank.py): its events are judged near or far by the whole trial's.
    dask_client=False: here, whatever DASHBOARD_DASK_SCHEDULER says (a task already on a cluster).
    processes: parse a local trial of PROCESS_PARSE_MIN_BYTES or more in this many forked
        worker processes (ForkedWorkers), when this process runs no other thread (a command
        line, not a threaded server); else, and by default, in this process.
    """
    store = store or open_store(path, roots=roots, s3_client=s3_client, s3_buckets=s3_buckets)
    files = store.list() if files is None else files
    if max_files is not None and len(files) > max_files:
        raise TrialTooLargeError(f"{path}: trial holds {len(files):,} files, over the limit of {max_files:,} files")
    if dask_client is None:
        from .dask_cluster import client_from_environment

        dask_client = client_from_environment()
    elif dask_client is False:
        dask_client = None
    if threads is None:
        # Local reads are quick, so more threads than cores only hold more files in memory;
        # S3 reads wait on the network, so they overlap many; so do a cluster's tasks.
        threads = (READ_THREADS if isinstance(store, S3Store) or dask_client is not None
                   else (os.cpu_count() or 2))
    jobs, report = [], LoadReport()
    report.files_skipped += [SkippedFile(key, reason) for key, reason in store.skipped]
    for info in sorted(files, key=lambda f: f.key):
        found = classify_key(info.key)
        if found is None:
            report.files_skipped.append(SkippedFile(info.key, NOT_A_TRIAL_FILE + ")"))
        else:
            jobs.append((info, *found))
    if not jobs:
        raise NotATrialError(f"{path}: not a trial: found no {FORMATS_LOOKED_FOR} ({len(files)} other file(s)"
                             + "".join(f"; {key}: {reason}" for key, reason in store.skipped[:3]) + ")")
    total_bytes = sum(info.size for info, _, _ in jobs)
    if max_bytes is not None and total_bytes > max_bytes:
        raise TrialTooLargeError(f"{path}: trial is {size_text(total_bytes)}, over the limit of "
                                 f"{size_text(max_bytes)}")

    parsers = None
    if (dask_client is None and processes is not None and processes > 1 and isinstance(store, LocalStore)
            and total_bytes >= PROCESS_PARSE_MIN_BYTES and ForkedWorkers.usable()):
        parsers = ForkedWorkers(min(processes, len(jobs)))
        # Two waiting on each process, so that each has the next file while its last one's
        # result comes back (the 300k trial's load, 5 runs each, alternated: 0.61-0.64 s against
        # 0.67-0.70 s with one; a reopen of the 3M trial from the columnar cache, whose files
        # these threads map, 1.4-2.6 s either way: that load's time is bimodal on this host).
        threads = max(threads, 2 * processes)
    try:
        return _load(path, store, files, jobs, report, guard_limits=(max_bytes, max_events), threads=threads,
                     on_progress=on_progress, file_cache=file_cache, cluster=dask_client or parsers,
                     center_us=center_us)
    finally:
        if parsers is not None:
            parsers.shutdown()


def _load(path, store, files, jobs, report, *, guard_limits, threads, on_progress, file_cache, cluster,
          center_us) -> Trial:
    max_bytes, max_events = guard_limits
    read: list[tuple[str, str, pa.Table]] = []  # (key, kind, table) of each file read with rows
    guard = _LoadGuard(path, max_bytes, max_events)
    first_copy: dict[bytes, str] = {}  # content digest -> key of the first file holding it
    fresh: dict[str, ParsedEntry] = {}  # parses new to file_cache
    pool = ThreadPoolExecutor(max_workers=max(1, min(threads, len(jobs))))
    # A .tmp file is still being written: its next version is another one, never worth keeping.
    cache_keys = [_file_cache_key(store.canonical_path, info)
                  if file_cache is not None and not info.key.endswith(".tmp") else None for info, _, _ in jobs]
    futures = [pool.submit(_parse_one, store, info, kind, node, guard, file_cache, cache_key, cluster)
               for (info, kind, node), cache_key in zip(jobs, cache_keys)]
    try:
        for done, ((info, kind, _), cache_key, future) in enumerate(zip(jobs, cache_keys, futures), 1):
            # A TrialError (S3 gone, access denied, over a limit) fails the load.
            parsed, digest, keep, nbytes = future.result()
            report.bytes_by_path[info.key] = nbytes
            if keep is not None:
                fresh[cache_key] = keep
            original = first_copy.setdefault(digest, info.key) if digest is not None else info.key
            if digest is not None:
                report.digests[info.key] = digest
            if original != info.key:
                report.files_skipped.append(SkippedFile(info.key, f"duplicate of {original}"))
            elif parsed.error:
                reason = parsed.error
                if kind == KINETO and not is_kineto_key(info.key) and reason.startswith(NOT_A_TRACE):
                    reason = f"{NOT_A_TRIAL_FILE}, and {reason})"  # a JSON file looked at for a trace
                report.files_skipped.append(SkippedFile(info.key, reason, parsed.transient))
            else:
                report.read_paths.append(info.key)
                if parsed.table is not None:
                    read.append((info.key, kind, parsed.table))
            if (parsed.lines_skipped or parsed.values_ignored) and original == info.key:
                if parsed.lines_skipped:
                    report.lines_skipped_by_path[info.key] = parsed.lines_skipped
                if parsed.values_ignored:
                    report.values_ignored_by_path[info.key] = parsed.values_ignored
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
    futures.clear()  # each holds its file's table: framework_frame frees them one by one
    parsed = keep = future = None  # (the last file's, as well)
    if not report.files_read and all(s.reason.startswith(NOT_A_TRIAL_FILE) for s in report.files_skipped
                                     if s.path in {info.key for info, _, _ in jobs}):
        # Only JSON files that are not traces (a config.json, a metrics dump): not a trial.
        raise NotATrialError(f"{path}: not a trial: found no {FORMATS_LOOKED_FOR} ({len(files)} other file(s), "
                             f"e.g. {report.files_skipped[0].path}: {report.files_skipped[0].reason})")
    # Kept only now that the whole load succeeded: a failed load leaves nothing behind. Written
    # by a few threads (encoding and writing let go of the GIL): one after another, the 1,157
    # files of a 3M-GetNext trial took 2.7 s of its 15 s cold load. A few: each holds its file's
    # encoding meanwhile.
    if fresh:
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(fresh), CACHE_WRITERS))) as writers:
            list(writers.map(lambda item: file_cache.__setitem__(*item), fresh.items()))
    fresh.clear()  # its entries hold the tables: let framework_frame free each as it converts it
    tables = _near_the_trial(read, report, center_us)
    read.clear()  # (as fresh: framework_frame frees each table as it converts it)
    kinds = {kind for _, kind, _ in jobs}
    trial_format = "kineto" if kinds == {KINETO} else "mixed" if KINETO in kinds else "smdebug"
    kineto_processes = sorted({process for table in tables[KINETO]
                               for process in table.column("process").unique().to_pylist()})
    # Popped: framework_frame frees each table as it copies it, unless this dict still holds it.
    trial = Trial(path=path, framework=frames.framework_frame(tables.pop(FRAMEWORK) + tables.pop(KINETO)),
                  system=frames.system_frame(tables.pop(SYSTEM)), report=report,
                  fingerprint=fingerprint(files), format=trial_format, kineto_processes=tuple(kineto_processes))
    arrow_memory.release_unused()
    return trial
