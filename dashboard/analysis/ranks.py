"""Data waiting by rank over time: which process of a job waits in GetNext, and when.

`rank_waits(framework)` summarises each process once: its GetNext intervals merged, and the
waiting they add up to by each interval's end. A heat map of any window and bucket count is
then a few binary searches per process and bucket edge (`heatmap`), so that it stays cheap
for hundreds of ranks: the figure gets buckets, never events.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import format as fmt
from ..trial.load import Process, processes_of
from .diagnosis.loaders import merge

ORDERS = ("host", "wait")  # rows by host then rank, or by the window's waiting, most first


@dataclass(frozen=True)
class ProcessWaits:
    """One process's GetNext waiting, summarised for any window."""
    process: Process
    starts: np.ndarray  # merged GetNext intervals, sorted
    ends: np.ndarray
    waited_before: np.ndarray  # waiting (us) of the intervals before each one

    def waited_by(self, times: np.ndarray) -> np.ndarray:
        """The waiting (us) from the process's first GetNext up to each time."""
        times = np.asarray(times, dtype=np.int64)
        if not len(self.starts):
            return np.zeros(len(times))
        at = np.searchsorted(self.starts, times, side="right") - 1  # the last interval begun by then
        inside = np.where(at >= 0, np.minimum(times - self.starts[np.maximum(at, 0)],
                                              self.ends[np.maximum(at, 0)] - self.starts[np.maximum(at, 0)]), 0)
        return np.where(at >= 0, self.waited_before[np.maximum(at, 0)] + inside, 0).astype(np.float64)


@dataclass(frozen=True)
class RankWaits:
    processes: list[ProcessWaits]  # by host, rank, pid
    start_us: int
    end_us: int


@dataclass(frozen=True)
class Heatmap:
    """Rows are processes, columns time buckets; `share` is the part of each bucket the
    process spent waiting in GetNext (0..1)."""
    processes: list[Process]
    labels: list[str]  # "algo-1 · rank 3"
    edges_us: np.ndarray  # buckets + 1 edges
    share: np.ndarray  # (processes, buckets)
    total: np.ndarray  # each row's share over the whole window

    @property
    def hottest(self) -> tuple[int, int] | None:
        """(row, bucket) of the largest share; None for an empty map."""
        if not self.share.size:
            return None
        row, bucket = np.unravel_index(int(np.argmax(self.share)), self.share.shape)
        return int(row), int(bucket)


def label(process: Process) -> str:
    return f"{process.node} · {process.label}"


def rank_waits(framework: pd.DataFrame) -> RankWaits:
    """Each process's GetNext waiting, summarised once per trial (one sort of the GetNexts by
    process, then each process's slice)."""
    calls = framework[(framework["kind"] == fmt.KIND_GETNEXT).to_numpy()]
    process = pd.Categorical(calls["process"])
    codes = process.codes.astype(np.int64)
    starts_all = calls["start_us"].to_numpy(dtype=np.int64)
    ends_all = calls["end_us"].to_numpy(dtype=np.int64)
    order = np.lexsort((starts_all, codes))
    codes, starts_all, ends_all = codes[order], starts_all[order], ends_all[order]
    bounds = np.searchsorted(codes, np.arange(len(process.categories) + 1))
    slices = {str(name): slice(bounds[i], bounds[i + 1]) for i, name in enumerate(process.categories)}
    out = []
    for identity in processes_of(framework):
        part = slices.get(identity.id)
        if part is None or part.start == part.stop:
            continue
        starts, ends = merge(starts_all[part], ends_all[part])
        durations = ends - starts
        before = np.concatenate([[0], np.cumsum(durations)[:-1]]).astype(np.int64)
        out.append(ProcessWaits(identity, starts, ends, before))
    start = int(min((w.starts[0] for w in out), default=0))
    end = int(max((w.ends[-1] for w in out), default=0))
    return RankWaits(out, start, end)


def bucket_edges(start_us: int, end_us: int, buckets: int) -> np.ndarray:
    """The edges of `buckets` equal time buckets over [start_us, end_us] (fewer when the span
    has fewer microseconds), rounded to whole microseconds."""
    buckets = max(1, min(int(buckets), max(end_us - start_us, 1)))
    return np.linspace(start_us, end_us, buckets + 1).round().astype(np.int64)


def heatmap(waits: RankWaits, start_us: int | None = None, end_us: int | None = None, buckets: int = 120,
            order: str = "host") -> Heatmap:
    """The share of each time bucket each process waits, over [start_us, end_us] (the job's
    GetNext span by default), rows in `order` (ORDERS)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
    start = waits.start_us if start_us is None else int(start_us)
    end = waits.end_us if end_us is None else int(end_us)
    edges = bucket_edges(start, end, buckets)
    buckets = len(edges) - 1
    widths = np.maximum(np.diff(edges), 1).astype(np.float64)
    rows = [w.waited_by(edges) for w in waits.processes]
    waited = np.diff(np.array(rows), axis=1) if rows else np.zeros((0, buckets))
    share = np.clip(waited / widths, 0.0, 1.0)
    total = (waited.sum(axis=1) / max(float(end - start), 1.0)) if rows else np.zeros(0)
    processes = [w.process for w in waits.processes]
    index = list(range(len(processes)))
    if order == "wait":
        index.sort(key=lambda i: -total[i])
    return Heatmap([processes[i] for i in index], [label(processes[i]) for i in index], edges,
                   share[index] if rows else share, total[index] if rows else total)
