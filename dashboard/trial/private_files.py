"""Cache folders private to their user, and files in them that appear whole or not at all.

Standard library only: the result cache's hit path (`app.py analyze --cache-dir`) uses it
without importing pandas.
"""
from __future__ import annotations

import contextlib
import os
import uuid
from typing import Iterable

PRIVATE_FOLDER, PRIVATE_FILE = 0o700, 0o600


def make_private_folder(directory: str) -> None:
    """Makes `directory` (0700), or checks it: one that others may enter is made private, one
    owned by another user refused (that user could put files there for the server to load).
    The one check of every cache folder (the server's caches use it too)."""
    os.makedirs(directory, mode=PRIVATE_FOLDER, exist_ok=True)
    info = os.stat(directory)
    if info.st_uid != os.geteuid():
        raise PermissionError(f"the cache folder {directory} belongs to another user (uid {info.st_uid}); "
                              f"give the cache a folder of its own")
    if info.st_mode & 0o077:
        os.chmod(directory, PRIVATE_FOLDER)  # (a folder made before, or under a loose umask)


def write_whole(path: str, chunks: Iterable) -> None:
    """Writes `chunks` (bytes-like) to `path`, 0600: through a temporary name in its folder,
    renamed into place, so that every reader sees the whole file or none. OSError when it
    cannot (nothing is left behind)."""
    temporary = os.path.join(os.path.dirname(path), f".{uuid.uuid4().hex}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    try:
        with os.fdopen(descriptor, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise


def files_by_last_use(directory: str, suffix: str) -> list[tuple[int, int, str]]:
    """The files of `directory` named *suffix, least recently used first (a hit touches its
    file): (mtime_ns, size, path) each; those gone meanwhile are left out. The order a cache
    culls in."""
    found = []
    with contextlib.suppress(OSError), os.scandir(directory) as scan:
        for item in scan:
            if item.name.endswith(suffix):
                with contextlib.suppress(OSError):
                    info = item.stat()
                    found.append((info.st_mtime_ns, info.st_size, item.path))
    return sorted(found)
