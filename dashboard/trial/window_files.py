"""A window of a loaded trial, read again from only the files whose events reach into it.

A trial's files are written in time order (the reference's writers rotate them by time), so a
window of minutes needs a few of them. A server holding large trials reads a window this way,
from the columnar cache (dashboard/trial/columnar_cache.py) where the files' parses are kept,
instead of holding every event of the trial (bounded by its event budget, --event-budget-mb).

The events are the whole trial's: each file's time span is the one the load measured (its first
start and last end, before any filter), so a file is left out only if none of its events
overlaps the window; the far-from-the-trial filter is the whole trial's (its median time); and
each process keeps the rank the whole trial gave it (a rank can be inferred from events that
another file holds).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import MutableMapping, Sequence

import numpy as np
import pandas as pd

from .errors import TrialError
from .load import Trial, load_trial
from .store import FileInfo


@dataclass(frozen=True)
class TrialFiles:
    """What reading a window of a loaded trial again takes: its files as listed, the time
    span and events of each, and each process's identity."""
    path: str
    files: tuple[FileInfo, ...]  # the files read with events, in key order
    first_us: np.ndarray  # each file's first start (system: first sample)
    last_us: np.ndarray  # each file's last end
    rows: np.ndarray  # each file's events (framework) or samples (system)
    center_us: int | None  # the trial's median time (load.trial_center)
    # Each process's (rank, local rank) in the whole trial (None: none).
    identity: dict[str, tuple[int | None, int | None]]
    bytes_per_row: float  # of the loaded frames, both kinds together

    @property
    def nbytes(self) -> int:
        """About what the trial's frames take in memory."""
        return int(self.rows.sum() * self.bytes_per_row)

    def reaching(self, start_us: int, end_us: int) -> np.ndarray:
        """Whether each file holds an event that overlaps [start_us, end_us]."""
        return (self.last_us >= start_us) & (self.first_us <= end_us)

    def window_nbytes(self, start_us: int, end_us: int) -> int:
        """About what reading the window [start_us, end_us] takes in memory."""
        return int(self.rows[self.reaching(start_us, end_us)].sum() * self.bytes_per_row)


def _frame_bytes(frame: pd.DataFrame) -> int:
    # The columns' own arrays (memory_usage would count an index's hash table, once built).
    return sum(int(frame[name].array.nbytes) for name in frame.columns)


def trial_files(trial: Trial, listing: Sequence[FileInfo]) -> TrialFiles:
    """The TrialFiles of a trial loaded whole from `listing` (the files it was loaded from)."""
    times = trial.report.file_times  # key -> (median, rows, first start, last end)
    files = tuple(info for info in sorted(listing, key=lambda f: f.key) if info.key in times)
    spans = np.array([times[info.key][1:] for info in files], dtype=np.int64).reshape(-1, 3)
    identity = {}
    if len(trial.framework):
        firsts = trial.framework.drop_duplicates("process")[["process", "rank", "local_rank"]]
        identity = {str(row.process): (None if pd.isna(row.rank) else int(row.rank),
                                       None if pd.isna(row.local_rank) else int(row.local_rank))
                    for row in firsts.itertuples(index=False)}
    loaded_rows = len(trial.framework) + len(trial.system)
    nbytes = _frame_bytes(trial.framework) + _frame_bytes(trial.system)
    return TrialFiles(path=trial.path, files=files, first_us=spans[:, 1], last_us=spans[:, 2], rows=spans[:, 0],
                      center_us=trial.report.center_us, identity=identity,
                      bytes_per_row=nbytes / loaded_rows if loaded_rows else 0.0)


def read_window(files: TrialFiles, start_us: int, end_us: int, *, roots: Sequence[str] | None = None,
                s3_buckets: Sequence[str] | None = None, file_cache: MutableMapping | None = None) -> Trial:
    """The trial's events of the files that reach into [start_us, end_us] (their parses from
    `file_cache` where it keeps them, else read again): the whole trial's events in that window
    are among them, with the same values. TrialError as load_trial's, and when a file the load
    read cannot be read again (its parse no longer cached, and the file gone or changed)."""
    chosen = [info for info, reaches in zip(files.files, files.reaching(start_us, end_us)) if reaches]
    if not chosen:
        from .frames import empty_framework_frame, system_frame
        from .load import LoadReport

        return Trial(files.path, empty_framework_frame(), system_frame([]), LoadReport())
    trial = load_trial(files.path, roots=roots, s3_buckets=s3_buckets, files=chosen, file_cache=file_cache,
                       center_us=files.center_us)
    if trial.report.files_skipped:  # read by the load, not now (gone, or unreadable): not that window
        missed = trial.report.files_skipped
        raise TrialError(f"{files.path}: {len(missed)} of the window's {len(chosen)} files could not be read "
                         f"again ({missed[0].path}: {missed[0].reason}); press Load to read the trial anew")
    _keep_identity(trial.framework, files.identity)
    return trial


def _keep_identity(framework: pd.DataFrame, identity: dict[str, tuple[int | None, int | None]]) -> None:
    """Gives each process the rank and local rank the whole trial gave it."""
    if framework.empty or not identity:
        return
    process = framework["process"].array  # (categorical: one value per process, spread by its codes)
    codes = process.codes.astype(np.int64)
    for column, at in (("rank", 0), ("local_rank", 1)):
        values = pd.array([identity.get(str(name), (None, None))[at] for name in process.categories], dtype="Int64")
        framework[column] = values.take(codes, allow_fill=True)
