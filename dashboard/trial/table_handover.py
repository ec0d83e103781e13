"""Arrow tables handed from forked worker processes to their parent through shared memory.

A worker that parsed a file returned its table pickled through the pool's pipe: pickled in the
worker, copied through the pipe, read and unpickled here, about 30 % of the CPU of a parse in 2
processes (300 files of the 3M-GetNext trial: 2.16 s parsing alone, 2.99 s with the results
pickled back, 2.36-2.45 s handed over this way: bench/parse_speed.py). Here the worker writes
the table as an Arrow IPC file in a private folder of a memory file system (/dev/shm), and the
parent maps it: its columns are read where the worker wrote them, never copied. The parent
removes the file's name at once; its memory goes back when the table's last buffer does.

Where there is no such file system, or it has no room to spare (a container's is often 64 MB,
and a DataLoader's workers share theirs through it), the table goes back pickled, as before.
A folder left by a process that was killed before it could remove it is removed by the next
one made on the same host.
"""
from __future__ import annotations

from .. import arrow_memory  # noqa: F401  (before pandas and pyarrow: see there)

import contextlib
import os
import shutil
import socket
import tempfile
import uuid

import pyarrow as pa

from .private_files import PRIVATE_FOLDER

SHARED_MEMORY_ROOT = "/dev/shm"
PREFIX = "dashboard-handover-"
# What a handover leaves free in the memory file system: what another user of it needs (the
# columnar cache leaves as much on its disk).
KEEP_FREE_BYTES = 64 * 2**20


class TableHandover:
    """A private folder in shared memory where worker processes leave tables for their parent.
    put (in a worker) and take (in the parent) move one table; a name is taken once."""

    def __init__(self, folder: str):
        self.folder = folder

    @classmethod
    def create(cls, root: str | None = None) -> "TableHandover | None":
        """A new handover folder under root (SHARED_MEMORY_ROOT), or None where it is no place
        for one."""
        root = root or SHARED_MEMORY_ROOT
        if not os.path.isdir(root) or not os.access(root, os.W_OK | os.X_OK):
            return None
        _remove_abandoned(root)
        try:
            folder = tempfile.mkdtemp(prefix=f"{PREFIX}{_host()}-{os.getpid()}-", dir=root)
            os.chmod(folder, PRIVATE_FOLDER)
        except OSError:
            return None
        return cls(folder)

    def put(self, table: pa.Table) -> str | None:
        """Writes the table (in a worker); its name for take, or None where it was not written
        (no room to spare, an I/O error): the caller then returns the table itself."""
        path = os.path.join(self.folder, uuid.uuid4().hex)
        try:
            if shutil.disk_usage(self.folder).free - table.nbytes < KEEP_FREE_BYTES:
                return None
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
        except (OSError, pa.ArrowIOError):  # (the file system filled meanwhile: another writer)
            with contextlib.suppress(OSError):
                os.remove(path)
            return None
        return os.path.basename(path)

    def take(self, name: str) -> pa.Table:
        """The table a worker put under this name (in the parent), mapped, not copied; the name
        is removed. OSError when it is not there (the folder was removed meanwhile)."""
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


def _host() -> str:
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:64]


def _remove_abandoned(root: str) -> None:
    """Removes this host's handover folders whose process is gone (killed before its close)."""
    mine = f"{PREFIX}{_host()}-"
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries:
            pid = entry.name[len(mine):].partition("-")[0] if entry.name.startswith(mine) else ""
            with contextlib.suppress(OSError):
                if (pid.isdigit() and not _alive(int(pid)) and entry.is_dir(follow_symlinks=False)
                        and entry.stat(follow_symlinks=False).st_uid == os.geteuid()):
                    shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
