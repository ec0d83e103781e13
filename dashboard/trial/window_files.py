"""A window of a loaded trial, read again from only the files whose events reach into it.

A trial's files are written in time order (the reference's writers rotate them by time), so a
window of minutes needs a few of them. A server holding large trials reads a window this way,
from the columnar cache (dashboard/trial/columnar_cache.py) where the files' parses are kept,
instead of holding every event of the trial (bounded by its event budget, --event-budget-mb).

The window's frames are the whole trial's rows in that window, with the same values and types:
- each file's time span is the one the load measured (its first start and last end, before any
  filter), so a file is left out only if none of its events overlaps the window;
- the far-from-the-trial filter is the whole trial's (its median time);
- each process keeps the rank the whole trial gave it (a rank can be inferred from events that
  another file holds), and each process scope keeps its host's system metrics;
- each categorical column keeps the whole trial's categories, in their order (what groups and
  traces are ordered by);
- a file is what the load read (its content digest), else the window is refused (TrialError).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import MutableMapping, Sequence

import numpy as np
import pandas as pd

from .errors import TrialError
from .frames import empty_framework_frame, system_frame
from .load import SYSTEM, LoadReport, Trial, classify_key, load_trial
from .store import FileInfo


@dataclass(frozen=True)
class TrialFiles:
    """What reading a window of a loaded trial again takes: its files as listed, the time
    span, size and content of each, and what the whole trial says of its processes."""
    path: str
    files: tuple[FileInfo, ...]  # the files read with events, in key order
    first_us: np.ndarray  # each file's first start (system: first sample)
    last_us: np.ndarray  # each file's last end
    file_bytes: np.ndarray  # about what each file's rows take in the frames
    digests: dict[str, bytes]  # each file's content, as the load read it
    center_us: int | None  # the trial's median time (load.trial_center)
    # Each process's host, rank and local rank in the whole trial (None: none).
    identity: dict[str, tuple[str, int | None, int | None]]
    categories: dict[str, list]  # "framework.<column>" / "system.<column>": the whole trial's

    @property
    def nbytes(self) -> int:
        """About what the trial's frames take in memory."""
        return int(self.file_bytes.sum())

    def reaching(self, start_us: int, end_us: int) -> np.ndarray:
        """Whether each file holds an event that overlaps [start_us, end_us]."""
        return (self.last_us >= start_us) & (self.first_us <= end_us)

    def window_nbytes(self, start_us: int, end_us: int) -> int:
        """About what the frames of the files reaching [start_us, end_us] take in memory."""
        return int(self.file_bytes[self.reaching(start_us, end_us)].sum())


def _frame_bytes(frame: pd.DataFrame) -> int:
    # The columns' own arrays (memory_usage would count an index's hash table, once built).
    return sum(int(frame[name].array.nbytes) for name in frame.columns)


def _categories(prefix: str, frame: pd.DataFrame) -> dict[str, list]:
    return {f"{prefix}.{name}": list(frame[name].cat.categories) for name in frame.columns
            if isinstance(frame[name].dtype, pd.CategoricalDtype)}


def trial_files(trial: Trial, listing: Sequence[FileInfo]) -> TrialFiles:
    """The TrialFiles of a trial loaded whole from `listing` (the files it was loaded from)."""
    times = trial.report.file_times  # key -> (median, rows, first start, last end)
    files = tuple(info for info in sorted(listing, key=lambda f: f.key) if info.key in times)
    spans = np.array([times[info.key][1:] for info in files], dtype=np.int64).reshape(-1, 3)
    per_row = {kind: _frame_bytes(frame) / len(frame) if len(frame) else 0.0
               for kind, frame in (("framework", trial.framework), (SYSTEM, trial.system))}
    kinds = [SYSTEM if (classify_key(info.key) or ("",))[0] == SYSTEM else "framework" for info in files]
    identity = {}
    if len(trial.framework):
        firsts = trial.framework.drop_duplicates("process")[["process", "node", "rank", "local_rank"]]
        identity = {str(row.process): (str(row.node), None if pd.isna(row.rank) else int(row.rank),
                                       None if pd.isna(row.local_rank) else int(row.local_rank))
                    for row in firsts.itertuples(index=False)}
    return TrialFiles(path=trial.path, files=files, first_us=spans[:, 1], last_us=spans[:, 2],
                      file_bytes=spans[:, 0] * np.array([per_row[kind] for kind in kinds]),
                      digests={info.key: trial.report.digests.get(info.key) for info in files},
                      center_us=trial.report.center_us, identity=identity,
                      categories={**_categories("framework", trial.framework), **_categories(SYSTEM, trial.system)})


def read_window(files: TrialFiles, start_us: int, end_us: int, *, roots: Sequence[str] | None = None,
                s3_buckets: Sequence[str] | None = None, file_cache: MutableMapping | None = None) -> Trial:
    """The trial's events of the files that reach into [start_us, end_us] (their parses from
    `file_cache` where it keeps them, else read again): the whole trial's events in that window
    are among them, as the whole trial has them. TrialError as load_trial's, and when a file the
    load read cannot be read again as it was (its parse no longer cached, and the file gone or
    changed)."""
    chosen = [info for info, reaches in zip(files.files, files.reaching(start_us, end_us)) if reaches]
    if chosen:
        trial = load_trial(files.path, roots=roots, s3_buckets=s3_buckets, files=chosen, file_cache=file_cache,
                           center_us=files.center_us)
    else:
        trial = Trial(files.path, empty_framework_frame(), system_frame([]), LoadReport())
    changed = [info.key for info in chosen if trial.report.digests.get(info.key) != files.digests[info.key]]
    if changed:
        skipped = {item.path: item.reason for item in trial.report.files_skipped}
        why = skipped.get(changed[0], "its content changed")
        raise TrialError(f"{files.path}: {len(changed)} of the window's {len(chosen)} files could not be read "
                         f"again as the load read them ({changed[0]}: {why}); press Load to read the trial anew")
    _keep_identity(trial.framework, files.identity)
    for prefix, frame in (("framework", trial.framework), (SYSTEM, trial.system)):
        _keep_categories(prefix, frame, files.categories)
    return trial


def window_part(files: TrialFiles, trial: Trial, node: str | None) -> Trial:
    """read_window's trial for a host or a process (`node`), as Trial.for_node of the whole
    trial gives it: a process's host's system metrics, whether or not the window holds its events."""
    part = trial.for_node(node)
    if node and node in files.identity:
        system = trial.system
        part = dataclasses.replace(part, system=system[(system["node"] == files.identity[node][0]).to_numpy()]
                                   .reset_index(drop=True))
    return part


def _keep_identity(framework: pd.DataFrame, identity: dict[str, tuple[str, int | None, int | None]]) -> None:
    """Gives each process the rank and local rank the whole trial gave it."""
    if framework.empty or not identity:
        return
    process = framework["process"].array  # (categorical: one value per process, spread by its codes)
    codes = process.codes.astype(np.int64)
    for column, at in (("rank", 1), ("local_rank", 2)):
        values = pd.array([identity.get(str(name), (None, None, None))[at] for name in process.categories],
                          dtype="Int64")
        framework[column] = values.take(codes, allow_fill=True)


def _keep_categories(prefix: str, frame: pd.DataFrame, categories: dict[str, list]) -> None:
    """Gives each categorical column the whole trial's categories, in their order (a window's
    files name them in another order of first appearance), and after them any it adds."""
    for name in frame.columns:
        whole = categories.get(f"{prefix}.{name}")
        if whole is None or not isinstance(frame[name].dtype, pd.CategoricalDtype):
            continue
        known = set(whole)
        frame[name] = frame[name].cat.set_categories(whole + [c for c in frame[name].cat.categories
                                                              if c not in known])
