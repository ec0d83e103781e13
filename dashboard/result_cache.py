"""Finished analyses of unchanged trials, for `app.py analyze --cache-dir`: a reopen of a trial
whose files did not change answers at once, without reading them.

An entry is the command's output as it was written (its JSON object, or its text), under a key
of everything that decides it: the code's version (dashboard/code_version.py), the trial's
canonical path and the fingerprint of its listing (each file's key, size and ETag, or mtime and ctime: a
new, grown or rewritten file, a growing `.tmp` file or a new S3 ETag makes another key), the
path as typed (the report names it) and the command's options. The analysis that fills an
entry reads the very listing its key was made of, and only a complete load is kept (none of its
files missing or unreadable at that moment): what a changed trial's key finds is nothing, never
an older answer.

Entries are files in `<cache-dir>/results/`, one per key: MAGIC | CRC-32 of the output |
length of the output | the output (UTF-8). A file whose header, length or checksum is not right
is a miss, removed, and written again by the run that missed. Files appear whole or not at all,
0600 in a 0700 folder; past MAX_ENTRIES the least recently used are removed.

Standard library only, with the listing (trial/store.py): a hit imports none of the analysis
(no pandas, no scipy).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import zlib
from typing import Sequence

from .code_version import code_version
from .trial.private_files import files_by_last_use, make_private_folder, write_whole
from .trial.store import FileInfo, fingerprint

RESULTS_FOLDER = "results"
MAGIC = b"DLPRES01"  # the layout's version: a file of another layout is a miss
_HEADER = struct.Struct("<8sIQ")
SUFFIX = ".result"
# A running job analysed every minute for a day makes 1,440 keys; a few hundred recent answers
# (a few KB each) are what a reopen can use.
MAX_ENTRIES = 256


class ResultCache:
    """Outputs of `analyze` by key (key(), get(), put()). Reading or writing never fails the
    command: an entry that cannot be read is a miss, one that cannot be written is not kept."""

    def __init__(self, cache_dir: str):
        make_private_folder(cache_dir)
        self.directory = os.path.join(cache_dir, RESULTS_FOLDER)
        make_private_folder(self.directory)

    @staticmethod
    def key(typed_path: str, canonical_path: str, files: Sequence[FileInfo], options: dict) -> str:
        """options: the command's, as JSON values (each one that can change the output)."""
        identity = json.dumps({"code": code_version(), "path": canonical_path, "typed": typed_path,
                               "listing": fingerprint(files), "options": options}, sort_keys=True)
        return hashlib.sha256(identity.encode()).hexdigest()

    def _path(self, key: str) -> str:
        if len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
            raise KeyError(key)  # key()'s digests: nothing else names a file here
        return os.path.join(self.directory, key + SUFFIX)

    def get(self, key: str) -> str | None:
        path = self._path(key)
        try:
            with open(path, "rb") as found:
                data = found.read()
        except OSError:
            return None
        output = _decode(data)
        if output is None:  # damaged, or of another layout: gone, written again by this run
            with contextlib.suppress(OSError):
                os.remove(path)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: the last to be removed
        return output

    def put(self, key: str, output: str) -> None:
        body = output.encode()
        try:
            write_whole(self._path(key), (_HEADER.pack(MAGIC, zlib.crc32(body), len(body)), body))
        except OSError:
            return  # a full or read-only disk: the command's answer stands without it
        self._cull()

    def _cull(self) -> None:
        entries = files_by_last_use(self.directory, SUFFIX)
        for _, _, path in entries[:max(len(entries) - MAX_ENTRIES, 0)]:
            with contextlib.suppress(OSError):
                os.remove(path)


def _decode(data: bytes) -> str | None:
    if len(data) < _HEADER.size:
        return None
    magic, crc, length = _HEADER.unpack_from(data)
    body = data[_HEADER.size:]
    if magic != MAGIC or length != len(body) or zlib.crc32(body) != crc:
        return None
    try:
        return body.decode()
    except UnicodeDecodeError:
        return None
