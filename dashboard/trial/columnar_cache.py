"""Parsed trial files kept as Arrow IPC files in a cache folder, for load_trial's file_cache.

A reopen of a trial, the refresh of a running job, or another server process reads a file's
columns from here instead of its JSON: memory-mapped, checked, and handed to the frames as
they are, with no unpickling (a pickle runs code; these files are data only).

One file per parsed trial file, named by load.py's file-cache key (the trial's canonical path,
the file's key, size and version, the parser's rules), so that a changed file is another
entry. Each cache file is a small header and an Arrow IPC file:

    MAGIC (8 bytes) | CRC-32 of the rest (4, little-endian) | length of the rest (8) | IPC file

with what the parse reported (lines skipped and why, the content's digest, bytes counted) in
the IPC schema's metadata, and without the table's columns of nulls alone (null_columns.py). A
file whose header, length, checksum, schema or metadata is not what this version writes is a
miss, removed and rebuilt by the next load: never a wrong answer.

Files are written to a temporary name and renamed into place (a reader sees a whole file or
none), 0600 in a 0700 folder, and a folder owned by another user is refused.
"""
from __future__ import annotations

from .. import arrow_memory  # noqa: F401  (before pandas and pyarrow: see there)

import contextlib
import json
import os
import shutil
import struct
import threading
import zlib

import pyarrow as pa

from .frames import FRAMEWORK_ARROW_SCHEMA, SYSTEM_ARROW_SCHEMA
from .load import ParsedEntry
from .null_columns import with_null_columns, without_null_columns
from .private_files import files_by_last_use, make_private_folder, write_whole
from .smdebug_format import ParsedFile

MAGIC = b"DLPCOL02"  # the layout's version: a file of another layout is a miss
_HEADER = struct.Struct("<8sIQ")
SUFFIX = ".arrow"
_META = b"dashboard.parsed"
_SCHEMAS = (FRAMEWORK_ARROW_SCHEMA, SYSTEM_ARROW_SCHEMA)
# What the cache leaves free on its disk: a full disk would fail the server's other writes.
DEFAULT_KEEP_FREE_BYTES = 64 * 2**20


class ColumnarFileCache:
    """A file_cache for load_trial (get and item assignment, as a dict) kept on disk as Arrow.

    size_limit_bytes: past it, the least recently used files are removed (a hit refreshes a
    file's time). keep_free_bytes: an entry is not written where the disk would keep less
    free. Writing never fails a load: an entry that cannot be written is not kept.
    """

    def __init__(self, directory: str, size_limit_bytes: int = 2 * 2**30,
                 keep_free_bytes: int = DEFAULT_KEEP_FREE_BYTES):
        make_private_folder(directory)
        self.directory = directory
        self.size_limit_bytes = size_limit_bytes
        self.keep_free_bytes = keep_free_bytes
        self._lock = threading.Lock()
        self._written_since_cull = self.size_limit_bytes  # the first write checks the folder's size

    def path_of(self, key: str) -> str:
        name = key.split(":", 1)[-1]
        if not name or not all(c in "0123456789abcdef" for c in name):
            raise KeyError(key)  # load.py's keys are hex digests: nothing else names a file here
        return os.path.join(self.directory, name + SUFFIX)

    def get(self, key: str, default=None) -> ParsedEntry | None:
        try:
            path = self.path_of(key)
        except KeyError:
            return default
        entry = self._read(path)
        if entry is None:
            return default
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: the last to be culled
        return entry

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None

    def _read(self, path: str) -> ParsedEntry | None:
        try:
            mapped = pa.memory_map(path, "r")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError:
            return None
        try:
            entry = _decode(mapped.read_buffer())
        except (pa.ArrowException, ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError,
                json.JSONDecodeError, OSError):
            entry = None
        finally:
            mapped.close()  # the table's buffers keep the mapping alive as long as they need it
        if entry is None:  # damaged, or written by another version: gone, rebuilt by the next load
            with contextlib.suppress(OSError):
                os.remove(path)
        return entry

    def __setitem__(self, key: str, entry: ParsedEntry) -> None:
        path = self.path_of(key)
        header, body = _encode(entry)
        size = len(header) + body.size
        try:
            if shutil.disk_usage(self.directory).free - size < self.keep_free_bytes:
                return
            write_whole(path, (header, body))  # (Arrow's buffer as it is: no copy of the file in memory)
        except OSError:
            return  # a full or read-only disk: the load goes on without keeping this file
        with self._lock:
            self._written_since_cull += size
            cull = self._written_since_cull >= self.size_limit_bytes // 8
            if cull:
                self._written_since_cull = 0
        if cull:
            self._cull()

    def _cull(self) -> None:
        """Removes the least recently used files until the folder holds size_limit_bytes."""
        files = files_by_last_use(self.directory, SUFFIX)
        total = sum(size for _, size, _ in files)
        for _, size, path in files:
            if total <= self.size_limit_bytes:
                break
            with contextlib.suppress(OSError):
                os.remove(path)
            total -= size


def _encode(entry: ParsedEntry) -> tuple[bytes, pa.Buffer]:
    """The file's header and its Arrow IPC body."""
    parsed = entry.parsed
    meta = json.dumps({"digest": entry.digest.hex(), "nbytes": entry.nbytes,
                       "lines_skipped": parsed.lines_skipped, "problems": parsed.problems,
                       "values_ignored": parsed.values_ignored}).encode()
    table = without_null_columns(parsed.table)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), _META: meta})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    body = sink.getvalue()
    return _HEADER.pack(MAGIC, zlib.crc32(body), body.size), body


def _decode(buffer: pa.Buffer) -> ParsedEntry | None:
    if buffer.size < _HEADER.size:
        return None
    magic, crc, length = _HEADER.unpack(buffer.slice(0, _HEADER.size).to_pybytes())
    body = buffer.slice(_HEADER.size)
    if magic != MAGIC or length != body.size or zlib.crc32(memoryview(body)) != crc:
        return None
    table = pa.ipc.open_file(body).read_all()
    meta = json.loads(table.schema.metadata[_META])
    table = with_null_columns(table).replace_schema_metadata(None)
    if not any(table.schema.equals(schema) for schema in _SCHEMAS):
        return None  # columns of another version of the frames
    parsed = ParsedFile(table, int(meta["lines_skipped"]), [str(p) for p in meta["problems"]],
                        values_ignored=int(meta["values_ignored"]))
    return ParsedEntry(parsed, bytes.fromhex(meta["digest"]), int(meta["nbytes"]))
