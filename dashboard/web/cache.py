"""Loaded trials, cached on disk (shared by every server process) and in memory.

A trial is cached under a key made of its path, the fingerprint of its listing (each file's
key, size, and ETag or mtime and ctime) and the code's version (dashboard/code_version.py). A load lists
the trial first: an unchanged trial is served from the cache at once; a trial that changed (a
running job wrote or rotated files) has a new key and is read again, so it is never served
stale; nor is one that other code read (an upgrade on the same cache folder). The path
in the key is the store's canonical one: `/data/x/` and `/data/./x` are one trial. Only
complete loads are stored: a load that fails raises before anything is written, and one that
skipped files missing or unreadable at that moment is shown but not kept as the listing's.

Each file's parse is cached too, as Arrow columns in a folder of its own (by its key, size
and version: dashboard/trial/columnar_cache.py): when a running job adds files, a reload, in
any server process, reads only those.

One listing is read (and analyzed) by one process at a time, across all server processes:
twenty users opening the same new trial at once wait for one read, and its memory, instead
of making twenty. A lock entry in the shared cache says who is at it.

The cache folder holds pickles (unpickling one runs code) and the background jobs' results:
it is private to the server's user. Its folders are made (or made again) 0700 and its files
0600, and a folder owned by another user is refused. A damaged database of the folder is set
aside (renamed, and said in the log) and an empty one started: it is only a cache.
"""
from __future__ import annotations

import contextlib
import copyreg
import errno
import hashlib
import io
import logging
import os
import pickle
import shutil
import socket
import sqlite3
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from typing import Callable, Sequence

import diskcache
import pandas as pd

from ..analysis import dataloader, diagnosis
from ..code_version import code_version
from ..analysis.dataloader import DEFAULT_OUTLIER_FACTOR, DataLoaderAnalysis
from ..trial.columnar_cache import ColumnarFileCache
from ..trial.private_files import PRIVATE_FILE, make_private_folder
from ..trial.errors import NotATrialError
from ..trial.load import Trial, load_trial
from ..trial.frames import missing_column
from ..trial.store import fingerprint, open_store

TRIALS_FOLDER = "trials"
COLUMNS_FOLDER = "columns"  # parsed files (dashboard/trial/columnar_cache.py)
JOBS_FOLDER = "jobs"
PAGE_PART = "page:"  # the names of drawn parts of pages (page_part)
MEMORY_ITEMS = 16  # trials, analyses, views and panels of the last few trials
MARK_USED_EVERY_S = 60.0  # the culling's order needs no finer clock than this
# A process that died without a word (killed) while loading holds the trial no longer than
# this; a holder gone from this host is noticed at once.
LOCK_EXPIRE_S = 600
LOCK_POLL_S = 0.05

Progress = Callable[[int, int], None]
log = logging.getLogger("dashboard.web")


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dataloader-dashboard")


class _ForkGuard:
    """Holds os.fork() back while a thread of this process is inside SQLite.

    Background loads are forked from the server process (Dash's DiskcacheManager). SQLite
    keeps its locks per process and fork copies them: a child forked while another thread
    of the parent holds a lock on a cache inherits a lock no thread of it will release, and
    can never write that cache (diskcache times out after 60 s; the load's progress and
    result are lost and the page just stops). Once none is inside, every ForkSafeCache's
    connections are closed: the child must not copy an open one either (ForkSafeCache)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._inside = 0
        os.register_at_fork(before=self._before_fork, after_in_parent=lambda: self._cond.release(),
                            after_in_child=self._after_in_child)

    @contextlib.contextmanager
    def inside(self):
        with self._cond:
            self._inside += 1
        try:
            yield
        finally:
            with self._cond:
                self._inside -= 1
                if not self._inside:
                    self._cond.notify_all()

    def _before_fork(self):
        self._cond.acquire()  # held through the fork: no thread enters SQLite meanwhile
        while self._inside:
            self._cond.wait()
        for cache in list(_FORK_SAFE_CACHES):  # none open for the child to copy (ForkSafeCache)
            try:
                cache._close_for_fork()
            except Exception:  # noqa: BLE001 - the others closed all the same (the fork goes ahead)
                log.exception("closing the connections of %s before a fork failed", cache.directory)

    def _after_in_child(self):
        self._cond, self._inside = threading.Condition(), 0  # the child has only the forking thread


FORK_GUARD = _ForkGuard()
_FORK_SAFE_CACHES: "weakref.WeakSet[ForkSafeCache]" = weakref.WeakSet()

# What the cache leaves free on its disk, of its own values: the background jobs' store (each
# load's progress and result, Dash's signing secret) is in the same folder, and on a full disk
# every load ends without a word (SQLite: "database or disk is full").
# A tenth of the disk, from 16 to 64 MiB: each SQLite database of the folder grows its write-ahead
# log to about 4 MB between checkpoints.
FREE_SPACE_RESERVE_MIN, FREE_SPACE_RESERVE_MAX = 16 * 2**20, 64 * 2**20


def free_space_reserve(disk_bytes: int) -> int:
    return min(FREE_SPACE_RESERVE_MAX, max(FREE_SPACE_RESERVE_MIN, disk_bytes // 10))


class OverSizeLimitError(ValueError):
    """A value larger than its cache's size limit: written, the limit's culling would take it (and
    the entries the cache held before it) at once."""

    def __init__(self, needed: int, limit: int):
        super().__init__(f"{_mb(needed)} to keep, over its size limit of {_mb(limit)}")


class CacheFullError(OSError):
    """A value the cache's disk has no room for, keeping its reserve free."""

    def __init__(self, needed: int, free: int, reserve: int):
        super().__init__(errno.ENOSPC, f"{_mb(needed)} to keep, {_mb(free)} free on the cache's disk, "
                                       f"{_mb(reserve)} of it kept free")
        self.needed = needed


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:,.1f} MB"


def compact_pickle(value, protocol: int) -> bytes:
    """pickle.dumps, with each column without a value (an all-missing Int64 or boolean array)
    pickled as its length and type: unpickled, it is a missing_column, whose pages cost nothing
    until written. A 3M-GetNext trial has eight such columns of 6M rows (370 MB of its pickle, read back
    and held by every server process that draws from it), its GetNext events and calls frames more."""
    def reduce(array):
        if len(array) and bool(array.isna().all()):
            return missing_column, (len(array), array.dtype)
        return array.__reduce_ex__(protocol)

    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=protocol)
    pickler.dispatch_table = copyreg.dispatch_table.copy()
    for kind in (pd.arrays.IntegerArray, pd.arrays.BooleanArray):
        pickler.dispatch_table[kind] = reduce
    pickler.dump(value)
    return out.getvalue()


class _PrivateDisk(diskcache.Disk):
    """Writes each large value's file 0600 (diskcache leaves it to the umask: 0644), and only where
    the disk keeps its reserve free after it (CacheFullError) and its cache's size limit can hold it
    (OverSizeLimitError); a write that fails half-way leaves no piece of a file behind."""

    size_limit: int | None = None  # its cache's (ForkSafeCache): diskcache's Disk is not told it

    def store(self, value, read, key=diskcache.core.UNKNOWN):
        if read or type(value) in (str, bytes, int, float):  # diskcache's own ways (none of ours)
            size, mode, filename, db_value = super().store(value, read, key=key)
            if filename:
                os.chmod(os.path.join(self._directory, filename), PRIVATE_FILE)
            return size, mode, filename, db_value
        # diskcache's way of a pickled value, with the room checked before the file is written
        result = compact_pickle(value, self.pickle_protocol)
        if len(result) < self.min_file_size:
            return 0, diskcache.core.MODE_PICKLE, None, sqlite3.Binary(result)
        if self.size_limit is not None and len(result) > self.size_limit:
            raise OverSizeLimitError(len(result), self.size_limit)
        usage = shutil.disk_usage(self._directory)
        reserve = free_space_reserve(usage.total)
        if usage.free - len(result) < reserve:
            raise CacheFullError(len(result), usage.free, reserve)
        filename, full_path = self.filename(key, value)
        os.makedirs(os.path.dirname(full_path), exist_ok=True)
        descriptor = os.open(full_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
        try:
            with os.fdopen(descriptor, "wb") as out:
                out.write(result)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(full_path)
            raise
        return len(result), diskcache.core.MODE_PICKLE, filename, None


class ForkSafeCache(diskcache.Cache):
    """A diskcache.Cache that a fork cannot break: its operations run inside the fork guard, and a
    fork closes every connection the process has open to it first. Private to this user: its
    folder 0700, its files 0600.

    SQLite keeps its locks' books per process, and a fork copies them. A connection opened in a
    forked child to a database that another thread of the parent had open at the fork takes its
    SHARED lock from the copied books, not from the kernel: the child holds no lock the other
    processes can see. The next connection to close elsewhere (the parent's own, after its
    request, or another server process's, after a poll) then finds itself the last,
    checkpoints and deletes the WAL and its index, and the child writes on into deleted files: a
    background load's result was lost so, its page told that it "ended without a result" (CI,
    two gunicorn workers; tests/test_web_units.py reproduces it). With no connection open at a
    fork, the child's books start empty and its locks are real. (Closing each operation's
    connection as it ends did that too, but opening one per operation, 50 loads at once gave
    SQLite "disk I/O error"s and busy timeouts.)"""

    def __init__(self, directory: str, **settings):
        self._operations = threading.local()  # per thread: how deep in operations it is
        self._connections: set[sqlite3.Connection] = set()  # every thread's, for a fork to close
        self._generation = 0  # how many forks closed them: a thread's older one is closed
        self._settings = settings  # what an empty database is started with (_set_aside)
        make_private_folder(directory)
        database = os.path.join(directory, diskcache.core.DBNAME)
        self._create_database_file(database)
        for name in (database, database + "-wal", database + "-shm"):
            with contextlib.suppress(FileNotFoundError):
                if os.stat(name).st_mode & 0o077:
                    os.chmod(name, PRIVATE_FILE)
        _FORK_SAFE_CACHES.add(self)
        with self._operation():
            super().__init__(directory, disk=_PrivateDisk, **settings)
        self._disk.size_limit = self.size_limit

    @staticmethod
    def _create_database_file(database: str) -> None:
        # Made here 0600, before SQLite makes it under the umask: SQLite gives its -wal and
        # -shm files the database's permissions. Only when it does not exist: closing a
        # descriptor of a database this process has open drops SQLite's POSIX locks on it.
        with contextlib.suppress(FileExistsError):
            os.close(os.open(database, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, PRIVATE_FILE))

    @contextlib.contextmanager
    def _operation(self):
        """One operation, inside the fork guard (operations nest: a transaction's reads and
        writes, a new connection's settings)."""
        depth = getattr(self._operations, "depth", 0)
        with FORK_GUARD.inside():
            self._operations.depth = depth + 1
            try:
                yield
            except sqlite3.DatabaseError as exc:
                if not depth and _damaged(exc):  # (the whole operation ended: none of its statements runs on)
                    self._set_aside(exc)
                raise
            finally:
                self._operations.depth = depth

    @property
    def _con(self):
        """The calling thread's connection: diskcache's, made closable by the thread that forks."""
        # Every statement comes through here: one outside an operation could run while another
        # thread forks.
        if not getattr(self._operations, "depth", 0):
            raise RuntimeError(f"ForkSafeCache: SQLite used outside an operation (in {self.directory})")
        local = self._local
        if getattr(local, "generation", None) != self._generation:  # (a fork counts it up: parent and child)
            local.__dict__.pop("con", None)  # closed before a fork
            local.generation = self._generation
        con = getattr(local, "con", None)
        if con is None:
            try:
                con = self._connect()
            except sqlite3.DatabaseError as exc:
                if not _damaged(exc):
                    raise
                self._set_aside(exc)  # (a connection's first statement: its operation goes on, on the new one)
                con = self._connect()
        return con

    def _connect(self) -> sqlite3.Connection:
        """diskcache's own _con (its connection, its per-connection settings), but usable from the
        thread that closes it before a fork (every other thread then waits outside SQLite):
        diskcache connects with check_same_thread left on, and has no way to say so."""
        database = os.path.join(self.directory, diskcache.core.DBNAME)
        con = sqlite3.connect(database, timeout=self.timeout, isolation_level=None, check_same_thread=False)
        self._local.con = con
        self._connections.add(con)
        with contextlib.suppress(FileNotFoundError):
            self._local.inode = os.stat(database).st_ino  # the file this connection found (_set_aside)
        try:
            settings = con.execute("SELECT key, value FROM Settings").fetchall()
        except sqlite3.OperationalError:
            settings = []  # (a new database: diskcache's __init__ makes the table)
        for key, value in settings:
            if key.startswith("sqlite_"):
                self.reset(key, value, update=False)
        return con

    def _set_aside(self, damage: sqlite3.DatabaseError) -> None:
        """Sets the database this thread's connection found damaged aside (renamed, said in the log)
        and starts an empty one: it is only a cache, and every operation on it would fail on (at
        start-up too). Only while that database is still the folder's: another process that met the
        damage first has set it aside, and started the one there now. This process's other threads
        go on with their connections to the old one until they close them (after each request, and
        at a fork) or meet the damage themselves. The values' files of the old database stay."""
        local = self._local
        con, inode = local.__dict__.pop("con", None), local.__dict__.pop("inode", None)
        if con is not None:
            self._connections.discard(con)
            with contextlib.suppress(sqlite3.Error):
                con.close()
        database = os.path.join(self.directory, diskcache.core.DBNAME)
        with contextlib.suppress(FileNotFoundError):
            if os.stat(database).st_ino == inode:
                aside = f"{database}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
                for suffix in ("", "-wal", "-shm"):
                    with contextlib.suppress(FileNotFoundError):
                        os.rename(database + suffix, aside + suffix)
                log.warning("the cache database %s is damaged (%s): set aside as %s, and an empty one started",
                            database, damage, aside)
        self._create_database_file(database)
        # Its tables, as diskcache makes them (idempotent: another process may be at it too).
        diskcache.Cache(self.directory, disk=_PrivateDisk, **self._settings).close()

    def intact(self, key) -> bool:
        """Whether `key` is there with its value whole, without reading it: a large value's file of
        the size written (a truncated or missing file is found here; one damaged within its size,
        when read: a miss then, TrialCache._get)."""
        with self._operation():
            db_key, raw = self._disk.put(key)
            rows = self._sql("SELECT filename, size FROM Cache WHERE key = ? AND raw = ?"
                             " AND (expire_time IS NULL OR expire_time > ?)", (db_key, raw, time.time())).fetchall()
        if not rows:
            return False
        ((filename, size),) = rows
        if filename is None:
            return True  # (in the database itself)
        try:
            return os.stat(os.path.join(self.directory, filename)).st_size == size
        except OSError:
            return False

    def _close_for_fork(self) -> None:
        """Closes every thread's connection (the fork guard's, before a fork: no thread is inside
        an operation); each thread opens a new one at its next. A connection with a statement
        not yet finished would stay open, its files with it (sqlite3_close_v2): diskcache fetches
        every statement's rows whole, and no cursor outlives its operation."""
        connections, self._connections = self._connections, set()
        self._generation += 1
        for con in connections:
            with contextlib.suppress(sqlite3.Error):
                con.close()

    @contextlib.contextmanager
    def _transact(self, retry=False, filename=None):
        with self._operation(), super()._transact(retry, filename) as transaction:
            yield transaction

    def get(self, *args, **kwargs):
        with self._operation():
            return super().get(*args, **kwargs)

    def __contains__(self, key):
        with self._operation():
            return super().__contains__(key)

    def mark_used(self, keys) -> None:
        """Marks entries as used now, as a read of each would (the least-recently-used culling
        then spares them): for entries whose presence is what a caller reads. diskcache's own
        statement of a read, on its own table."""
        update = diskcache.core.EVICTION_POLICY[self.eviction_policy]["get"]
        if update is None:
            return
        with self._transact(retry=True) as (sql, _):
            now = time.time()
            for key in keys:
                db_key, raw = self._disk.put(key)
                sql(f"UPDATE Cache SET {update.format(now=now)} WHERE key = ? AND raw = ?", (db_key, raw))

    def close(self):
        """Closes the calling thread's connection. A thread that used the cache calls it before
        it ends (the server after each request, the job queue's dispatcher before it stops):
        left to the cache, the connections of ended threads pile up until a fork closes them."""
        with FORK_GUARD.inside():
            self._connections.discard(getattr(self._local, "con", None))
            super().close()

    def __enter__(self):
        return self  # (diskcache's opens the connection outside an operation: the first one does)

    def __iter__(self):
        with self._operation():  # the keys read at once: a generator would run SQL outside an operation
            return iter(list(super().__iter__()))

    # diskcache's reads that run SQL outside a transaction (the culling's size and count).
    def reset(self, *args, **kwargs):
        with self._operation():
            return super().reset(*args, **kwargs)

    def volume(self):
        with self._operation():
            return super().volume()


def _damaged(error: sqlite3.DatabaseError) -> bool:
    """Whether SQLite found its database damaged (not a database, or a malformed one), not merely
    busy, full or unreadable."""
    return (getattr(error, "sqlite_errorcode", 0) & 0xFF) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _lock_token() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"


def _process_alive(token: str) -> bool:
    """Whether the process that took a lock (its token from _lock_token) still runs. A
    process of another host (a cache folder shared over the network) counts as alive; a
    killed one not yet reaped by its parent (a zombie: a cancelled background load) does not."""
    import psutil

    parts = token.split(":")
    if len(parts) != 3 or not parts[1].isdigit() or parts[0] != socket.gethostname():
        return True  # cannot tell from here: the lock's expiry decides
    try:
        return psutil.Process(int(parts[1])).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # it exists, but cannot be inspected


# What made a cached trial, an analysis or a drawn part of a page: an upgrade on the same cache
# folder (a parser's fix, a class of other attributes, other frame columns or rules of keeping)
# reads the trial again and computes its own, never served what older code made.
CODE_VERSION = code_version()


def trial_spelling(path: str) -> str:
    """The one spelling of a trial path the page shows (its URL): `/data/./x/`, `/data//x` and
    ` /data/x ` are `/data/x`; `s3://b/p` and `s3://b//p/` are `s3://b/p/`, as the stores name
    them. A link is not resolved, nor `..` (after a link it is not the parent): the URL does not
    tell where links lead, and it opens the same trial."""
    path = path.strip()
    if path.startswith("s3://"):
        bucket, _, prefix = path[len("s3://"):].partition("/")
        return f"s3://{bucket}/" + (prefix.strip("/") + "/" if prefix.strip("/") else "")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    return ("/" if path.startswith("/") else "") + "/".join(parts) if parts else ("/" if path.startswith("/") else ".")


def trial_key(path: str, listing_fingerprint: str) -> str:
    """path: the store's canonical_path."""
    identity = f"{path}\0{listing_fingerprint}\0{CODE_VERSION}"
    return hashlib.sha256(identity.encode()).hexdigest()[:32]


def _derived_name(what: str, key: str, node: str | None, factor: float) -> str:
    """The cache's name of an analysis ("analysis", "assessment") of a trial's node."""
    return f"{what}:{CODE_VERSION}:{key}:{node or ''}:{factor:g}"


class _Memory:
    """A small LRU of objects this process already unpickled or computed."""

    def __init__(self, size: int):
        self.size = size
        self.items: OrderedDict = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key):
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        return None

    def put(self, key, value):
        with self.lock:
            self.items[key] = value
            self.items.move_to_end(key)
            while len(self.items) > self.size:
                self.items.popitem(last=False)


def _page_part_name(name: str) -> str:
    return f"{PAGE_PART}{CODE_VERSION}:{name}"


class TrialCache:
    """Trials and their analyses by key: memory, then the shared disk cache.

    A value the disk cannot keep (no room even after culling, or a disk that refuses writes) is
    kept in this process's memory only, and `not_kept()` says why: the page says so, and the
    trial is still shown."""

    def __init__(self, directory: str, size_limit_mb: int = 2048, max_files: int | None = None):
        self.directory = directory
        self.max_files = max_files  # trials listing more files are refused (TrialTooLargeError)
        make_private_folder(directory)
        self.disk = ForkSafeCache(os.path.join(directory, TRIALS_FOLDER),
                                size_limit=int(size_limit_mb) * 2**20,
                                eviction_policy="least-recently-used")
        # Each file's parse, as Arrow columns any server process maps (no pickles): a reload of a
        # running job's trial reads only its new files. Its own folder, with a limit of its own.
        # The columns yield first on a small disk: they stop where the disk still has the reserve
        # and as much again, room for the trials and analyses this cache culls for.
        columns = os.path.join(directory, COLUMNS_FOLDER)
        self.files = ColumnarFileCache(columns, size_limit_bytes=int(size_limit_mb) * 2**20,
                                       keep_free_bytes=2 * free_space_reserve(shutil.disk_usage(directory).total))
        self.memory = _Memory(MEMORY_ITEMS)
        # Drawn parts of pages have a memory of their own: cheap to read back from the disk, they
        # do not push trials and analyses out of this process's memory.
        self.page_memory = _Memory(MEMORY_ITEMS)
        self._local = threading.local()  # not_kept, per thread: a load and its writes run in one
        self._cull_lock = threading.Lock()
        self._marked: dict[str, float] = {}  # name -> when this process last marked it used

    def _mark_used(self, names: Sequence[str]) -> None:
        """disk.mark_used for names not marked in the last MARK_USED_EVERY_S: a write per name
        and minute, not one per callback (every drag asks holds())."""
        now = time.monotonic()
        due = [name for name in names if now - self._marked.get(name, -MARK_USED_EVERY_S) >= MARK_USED_EVERY_S]
        if due:
            self.disk.mark_used(due)
            self._marked.update(dict.fromkeys(due, now))

    def _memory_of(self, key: str) -> _Memory:
        return self.page_memory if key.startswith(PAGE_PART) else self.memory

    def _get(self, key: str):
        memory = self._memory_of(key)
        value = memory.get(key)
        if value is None:
            try:
                value = self.disk.get(key)
            except Exception:  # noqa: BLE001 - pickled by an older version, or damaged: computed again
                value = None
                # Gone from the disk too: the next load (ready() asks the disk) reads it again.
                with contextlib.suppress(Exception):
                    self.disk.delete(key)
            if value is not None:
                memory.put(key, value)
        return value

    def _put(self, key: str, value) -> bool:
        self._memory_of(key).put(key, value)
        return self._keep(key, value)

    def _keep(self, key: str, value) -> bool:
        """Stores a value on the disk, culling the least recently used ones where its disk has no
        room for it; False (and not_kept() says why) where it cannot."""
        for attempt in (1, 2):
            try:
                self.disk.set(key, value)
                if key in self.disk:
                    return True
                # Culled by its own write: with the database's own pages, over the size limit.
                problem = "the cache's size limit culled it as it was written"
            except OverSizeLimitError as exc:
                problem = f"larger than the cache: {exc}"
            except CacheFullError as exc:
                if attempt == 1 and self._make_room(exc.needed):
                    continue
                problem = f"no room for it: {exc.strerror}"
            except (OSError, sqlite3.Error, diskcache.Timeout) as exc:  # a full, read-only or broken disk
                problem = f"its disk refused to write it ({type(exc).__name__}: {exc})"
            break
        if getattr(self._local, "not_kept", None) is None:
            log.warning("the trial cache in %s could not keep %s: %s", self.directory, key.split(":")[0], problem)
        self._local.not_kept = problem
        return False

    def _make_room(self, needed: int) -> bool:
        """Culls the least recently used values until the disk has `needed` bytes free beyond
        its reserve; False when it cannot (the cache's own files are not that much)."""
        usage = shutil.disk_usage(self.disk.directory)
        short = needed + free_space_reserve(usage.total) - usage.free
        if short <= 0:
            return True
        if short > self.disk.reset("size"):  # the bytes of its values' files, all of them
            return False
        with self._cull_lock:
            limit = self.disk.size_limit
            self.disk.size_limit = max(0, self.disk.volume() - short)  # this object only, not the setting
            try:
                self.disk.cull()
            finally:
                self.disk.size_limit = limit
        usage = shutil.disk_usage(self.disk.directory)
        return usage.free - needed >= free_space_reserve(usage.total)

    def not_kept(self) -> str | None:
        """Why the disk did not keep what this thread's last load read (None: it kept it all)."""
        return getattr(self._local, "not_kept", None)

    def _source(self, key: str) -> tuple | None:
        """(path, load options, why the disk did not keep it) of a trial the disk could not keep:
        how to read it again (trial()); None for any other."""
        try:
            source = self.disk.get(f"source:{key}")
        except Exception:  # noqa: BLE001 - as _get: none to read again
            return None
        return source if isinstance(source, tuple) and len(source) == 3 else None

    def trial(self, key: str) -> Trial | None:
        """A loaded trial by key, or None when it is not (or no longer) cached. One the disk could
        not keep is read again, into this process's memory, while its files are as they were."""
        found = self._get(f"trial:{key}")
        if found is None:
            source = self._source(key)
            if source is not None:
                path, options = source[:2]
                again, found, _ = self.load(path, **options)
                if again != key:  # the trial changed since: not the one asked for
                    found = None
        return found

    def load(self, path: str, *, roots: Sequence[str] | None = None,
             s3_buckets: Sequence[str] | None = None, on_progress: Progress | None = None,
             on_listed: Callable[[int], None] | None = None, max_bytes: int | None = None,
             max_events: int | None = None, on_wait: Callable[[], None] | None = None,
             listed: tuple | None = None) -> tuple[str, Trial, bool]:
        """(key, trial, from_cache) for a trial path; TrialError when it cannot be read.
        listed: what listing() gave for the path, when the caller has listed it already.

        Lists the trial, then reads it only when this listing was not loaded before. While
        another load (of any server process) reads the same listing, waits for it, calling
        on_wait once, and returns what it read (from_cache True); if that load fails, reads.
        A trial without a single event is refused (NotATrialError), not cached; one over
        max_bytes or max_events (TrialTooLargeError) too.
        """
        self._local.not_kept = None
        key, store, files = listed or self.listing(path, roots=roots, s3_buckets=s3_buckets, on_listed=on_listed)

        def read() -> Trial:
            # processes: a background load runs in a process of its own (Dash forks one per load),
            # with no other thread: a large local trial's files are parsed on every core there.
            # In the threaded server process itself, load_trial parses in that process.
            trial = load_trial(path, store=store, files=files, on_progress=on_progress, max_bytes=max_bytes,
                               max_events=max_events, max_files=self.max_files, file_cache=self.files,
                               processes=os.cpu_count())
            if trial.framework.empty and trial.system.empty:
                reasons = sorted({s.reason for s in trial.report.files_skipped})
                raise NotATrialError(
                    f"{path}: the trial holds no events: {trial.report.files_read} file(s) read, "
                    f"{len(trial.report.files_skipped)} skipped"
                    + (f" ({'; '.join(reasons[:3])})" if reasons else ""))
            return trial

        trial, cached = self._once(f"trial:{key}", read, on_wait, keep=lambda t: t.report.complete)
        if trial.report.complete and f"span:{key}" not in self.disk:
            self._keep(f"span:{key}", (trial.start_us, trial.end_us))  # what ready() answers with
        if not trial.report.complete:
            # Files missing or unreadable just now: the trial is shown, with its skips, under a
            # key of its own (the page draws it by key), never under the listing's key, so that
            # the next load (Refresh) reads them again instead of serving this part for good.
            missing = "\0".join(sorted(s.path for s in trial.report.files_skipped if s.transient))
            key = trial_key(store.canonical_path, f"{fingerprint(files)}\0partial\0{missing}")
            self._put(f"trial:{key}", trial)
        if self.not_kept() is not None and f"trial:{key}" not in self.disk:
            # Kept in this process's memory only: how to read it again, for the other processes
            # (the page's own server process draws it) and for this one once it is forgotten.
            options = {"roots": roots, "s3_buckets": s3_buckets, "max_bytes": max_bytes, "max_events": max_events}
            self._keep(f"source:{key}", (path, options, self.not_kept()))
        elif self.not_kept() is None and cached and f"trial:{key}" not in self.disk:
            # Served from this process's memory (it read the trial before): the disk still does
            # not keep it, and the page says so again.
            source = self._source(key)
            if source is not None:
                self._local.not_kept = source[2]
        elif not cached and self.not_kept() is None:
            # Read and kept: a reason kept from an earlier read that the disk refused is no longer
            # true (a later eviction from the disk is not that refusal).
            with contextlib.suppress(Exception):  # (as _get's delete: the entry stays, stale)
                self.disk.delete(f"source:{key}")
        return key, trial, cached

    def listing(self, path: str, *, roots: Sequence[str] | None = None, s3_buckets: Sequence[str] | None = None,
                on_listed: Callable[[int], None] | None = None) -> tuple[str, object, list]:
        """(key, store, files) of a trial path as listed now; TrialError when it cannot be."""
        store = open_store(path, roots=roots, s3_buckets=s3_buckets)
        files = store.list()
        if on_listed is not None:
            on_listed(len(files))
        # By the store's one name of the trial: `/data/x/` and `/data/./x` are one read.
        return trial_key(store.canonical_path, fingerprint(files)), store, files

    def ready(self, key: str, nodes: Sequence[str | None],
              factor: float = DEFAULT_OUTLIER_FACTOR) -> tuple[int | None, int | None] | None:
        """The (start_us, end_us) of a trial whose page finds all it needs on the disk already:
        the trial (whole: kept only so), and the analysis and assessment of each node, each
        intact; else None (the load reads them again). Nothing is read back: a warm 3M-GetNext
        trial's load spent 0.6 s unpickling what its page then reads again in the server's own
        process."""
        names = [f"trial:{key}", *(_derived_name(what, key, node, factor) for node in nodes
                                   for what in ("analysis", "assessment"))]
        if not all(self.disk.intact(name) for name in names):
            return None
        self._mark_used(names)  # not read back, but used: the culling must not take them first
        span = self._get(f"span:{key}")
        return tuple(span) if span is not None else None

    def _once(self, name: str, compute: Callable[[], object],
              on_wait: Callable[[], None] | None = None,
              keep: Callable[[object], bool] | None = None) -> tuple[object, bool]:
        """(value, from_cache): the cached value `name`, else compute() stored under it (unless
        keep(value) says it is not worth keeping).

        One process computes a name at a time: the others wait for it (calling on_wait once)
        and take its value, or compute it themselves when it failed or was not kept.
        """
        value = self._get(name)
        if value is not None:
            return value, True
        with self._computing(name, on_wait):
            value = self._get(name)  # computed by the process this one waited for
            if value is not None:
                return value, True
            value = compute()
            if keep is None or keep(value):
                self._put(name, value)
        return value, False

    @contextlib.contextmanager
    def _computing(self, name: str, on_wait: Callable[[], None] | None = None):
        """Held while this process computes `name`; waits while another process does."""
        lock = f"computing:{name}"
        token = _lock_token()
        told = False
        while not self.disk.add(lock, token, expire=LOCK_EXPIRE_S):
            holder = self.disk.get(lock)
            if holder is not None and not _process_alive(holder):
                self._release(lock, holder)  # its process is gone: the lock with it
                continue
            if not told and on_wait is not None:
                on_wait()
                told = True
            time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            self._release(lock, token)

    def _release(self, lock: str, token: str) -> None:
        with self.disk.transact():  # only the holder's own lock: it may have expired and been taken
            if self.disk.get(lock) == token:
                self.disk.delete(lock)

    def analysis(self, key: str, trial: Trial, node: str | None = None,
                 factor: float = DEFAULT_OUTLIER_FACTOR) -> DataLoaderAnalysis:
        """The DataLoader analysis of a cached trial (or of one node of it), computed once."""
        return self._once(_derived_name("analysis", key, node, factor),
                          lambda: dataloader.analyze(trial.for_node(node).framework, factor))[0]

    def assessment(self, key: str, trial: Trial, node: str | None = None,
                   factor: float = DEFAULT_OUTLIER_FACTOR) -> diagnosis.Assessment:
        """The input-bound verdict and recommendations of a cached trial (or one node of it),
        computed once (analyses(): both, in the order that keeps the peak memory low)."""
        def assess() -> diagnosis.Assessment:
            part = trial.for_node(node)
            return diagnosis.assess(part.framework, part.system, factor)

        return self._once(_derived_name("assessment", key, node, factor), assess)[0]

    def kept_assessment(self, key: str, node: str | None = None,
                        factor: float = DEFAULT_OUTLIER_FACTOR) -> diagnosis.Assessment | None:
        """assessment() as kept (by any server process), or None: never computed here."""
        return self._get(_derived_name("assessment", key, node, factor))

    def analyses(self, key: str, trial: Trial, node: str | None = None,
                 factor: float = DEFAULT_OUTLIER_FACTOR) -> tuple[diagnosis.Assessment, DataLoaderAnalysis]:
        """(assessment, analysis) of a cached trial (or node), each computed once, the assessment
        first: its working memory is then freed before the analysis holds its copies of the
        events (dashboard.analyze's `assess`)."""
        assessment = self.assessment(key, trial, node, factor)
        return assessment, self.analysis(key, trial, node, factor)

    def holds(self, key: str) -> bool:
        """Whether trial(key) finds the trial (kept, or its files to read again): what a page
        drawn from it (page_part()) needs to stay more than a picture. (A trial kept only as its
        files counts even if they have changed since: trial() then finds none, and the page's next
        step that needs the trial says it is gone.)"""
        name = f"trial:{key}"
        if self.memory.get(name) is not None:
            return True
        for kept in (name, f"source:{key}"):
            if self.disk.intact(kept):
                self._mark_used([kept])  # what a page shows from its parts: used, not read back
                return True
        return False

    def page_part(self, name: str, compute: Callable[[], object]):
        """A part of a page drawn from a cached trial (figures, texts: a function of the trial's
        key, the node and the code, named so by the caller), computed once and kept on the disk:
        a new server process shows a warm trial's first page without reading the trial back
        (a 3M-GetNext trial's first page took 5 s of a new server process, 0.4 s of it reading the
        trial back; from its parts, 0.4 s in all)."""
        return self._once(_page_part_name(name), compute)[0]

    def kept_page_part(self, name: str):
        """A part page_part() kept (computed by any server process), or None: never computed here."""
        return self._get(_page_part_name(name))

    def memo(self, name: str, compute: Callable[[], object]):
        """An object derived from cached data, kept in this process's memory only."""
        value = self.memory.get(name)
        if value is None:
            value = compute()
            self.memory.put(name, value)
        return value

    def memoized(self, name: str) -> bool:
        """Whether memo(name) holds its object in this process's memory now."""
        return self.memory.get(name) is not None

    def close(self) -> None:
        self.disk.close()
