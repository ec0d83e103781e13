"""Errors raised when a trial cannot be read. Each message names the path and what is wrong."""


class TrialError(Exception):
    """A trial could not be read."""


class TrialNotFoundError(TrialError):
    """The path does not exist (folder, bucket or prefix)."""


class TrialAccessError(TrialError):
    """The path exists but may not be read (S3 permissions, outside the data roots)."""


class NotATrialError(TrialError):
    """The path holds no profiler files."""


class TrialTooLargeError(TrialError):
    """The trial is larger than the configured limit."""


class FileOutsideTrialError(TrialAccessError):
    """One file of a trial may not be read (a link leading out of the trial).

    Only that file is skipped and reported; the rest of the trial still loads.
    """


class NotAFileError(TrialAccessError):
    """One file of a trial is not a regular file (a FIFO, a device, a socket): opening a FIFO
    waits for a writer for ever, and a device such as /dev/zero reads without end.

    Only that file is skipped and reported (for good: it is not a read that may succeed later).
    """


def size_text(count: int) -> str:
    """A byte count for messages: '1.5 MB', '20.0 kB', '512 bytes'."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"
