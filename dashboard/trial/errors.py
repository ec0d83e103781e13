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
