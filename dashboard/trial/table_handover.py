"""Arrow tables handed from forked worker processes to their parent through shared memory.

A worker that parsed a file returned its table pickled through the pool's pipe: pickled in the
worker, copied through the pipe, read and unpickled here, about 30 % of the CPU of a parse in 2
processes (300 files of the 3M-GetNext trial: 2.16 s parsing alone, 2.99 s with the results
pickled back, 2.36-2.45 s handed over this way; bench/parse_speed.py measures the load's own
workers both ways). Here the worker writes the table as an Arrow IPC file in a private folder of
a memory file system (/dev/shm), and the parent maps it: its columns are read where the worker
wrote them, never copied. The parent removes the file's name at once; its memory goes back when
the table's last buffer does.

Where there is no such file system, or it has no room to spare (a container's is often 64 MB,
and a DataLoader's workers share theirs through it), or a write fails, the table goes back
pickled, as before. The parent holds a lock on its folder while it lives (flock: the kernel
lets go of it when the process ends, however it ends); a folder nobody holds, left by a process
that was killed before it could remove it, is removed by the next handover made there.

A parse worker's table comes without its columns of nulls alone (load.parse_file_for_client,
null_columns.py: 54 % of a 3M-GetNext trial's tables), and the parent makes it whole again.
"""
from __future__ import annotations

from .. import arrow_memory  # noqa: F401  (before pandas and pyarrow: see there)

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import uuid

import pyarrow as pa

SHARED_MEMORY_ROOT = "/dev/shm"
PREFIX = "dashboard-handover-"
# What a handover leaves free in the memory file system: what another user of it needs (the
# columnar cache leaves as much on its disk). Workers check it each before they write, so
# together they may leave less by a table or two; a write that finds the space gone fails, and
# its table goes back pickled.
KEEP_FREE_BYTES = 64 * 2**20


class TableHandover:
    """A private folder in shared memory where worker processes leave tables for their parent.
    put (in a worker) and take (in the parent) move one table; a name is taken once."""

    def __init__(self, folder: str, lock: int | None = None):
        self.folder = folder
        self._lock = lock  # the parent's descriptor of its folder, locked (None in a worker's copy)

    def __getstate__(self) -> dict:  # (sent to the workers with each task: the folder alone)
        return {"folder": self.folder, "_lock": None}

    @classmethod
    def create(cls, root: str | None = None) -> "TableHandover | None":
        """A new handover folder under root (SHARED_MEMORY_ROOT), held by this process, or None
        where it is no place for one."""
        root = root or SHARED_MEMORY_ROOT
        if not os.path.isdir(root) or not os.access(root, os.W_OK | os.X_OK):
            return None
        _remove_abandoned(root)
        try:
            folder = tempfile.mkdtemp(prefix=PREFIX, dir=root)  # (0700)
            lock = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        fcntl.flock(lock, fcntl.LOCK_EX)  # (a new folder: no one else holds it)
        return cls(folder, lock)

    def put(self, table: pa.Table) -> str | None:
        """Writes the table (in a worker); its name for take, or None where it was not written
        (no room to spare, an I/O error, a table Arrow's file format refuses): the caller then
        returns the table itself."""
        path = os.path.join(self.folder, uuid.uuid4().hex)
        try:
            if shutil.disk_usage(self.folder).free - table.nbytes < KEEP_FREE_BYTES:
                return None
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
        except Exception:  # noqa: BLE001 - whatever failed, the pipe still carries the table
            with contextlib.suppress(OSError):
                os.remove(path)
            return None
        return os.path.basename(path)

    def take(self, name: str) -> pa.Table:
        """The table a worker put under this name (in the parent), mapped, not copied; the name
        is removed. OSError when it is not there or not whole (the folder was removed meanwhile)."""
        path = os.path.join(self.folder, name)
        try:
            with pa.memory_map(path) as mapped:  # (the table's buffers keep the mapping alive)
                return pa.ipc.open_file(mapped).read_all()
        except pa.ArrowInvalid as exc:
            raise OSError(f"a damaged handover file: {exc}") from exc
        finally:
            with contextlib.suppress(OSError):
                os.remove(path)

    def close(self) -> None:
        """Removes the folder and what is left in it (tables already taken stay mapped)."""
        shutil.rmtree(self.folder, ignore_errors=True)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _remove_abandoned(root: str) -> None:
    """Removes the handover folders under root that are this user's and that no process holds.
    Never fails: whatever it cannot look at or remove, it leaves."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            held = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # OSError: a live process holds it
            shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            pass
        finally:
            os.close(held)
