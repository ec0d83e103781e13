"""Where a trace records no worker ids (torch.profiler): how many workers a multi-process
loader had, and each batch's place in its iterator's rounds.

Under in-order delivery batch b of an epoch goes to worker b mod num_workers (torch's
`_reset` starts the cycle at worker 0 every epoch), and the waits recur once per round: on
the batch first in line for alike workers, on the slow worker's batch for one slow worker.
The worker count is the stalls' period. Which worker a stall is on needs the batch's number
in its epoch, which a trace gives only as far as it shows the epoch begin:
- a recording begun mid-epoch missed an unknown number of batches. Its first batch, a stall
  or not, says nothing of that number: a first batch that waits 5x a ready one was once taken
  for one that paid the workers' start, and a recording that began 9 batches into an epoch of
  a slow worker 1 had its stall on worker 1 taken for worker 0's, turning the slow worker
  into "too few workers". Only the iterator's creation shown in the trace
  (Loader.seen_from_start) places the rounds;
- a recording of several epochs of one loader is one segment: nothing in the trace marks
  torch's `_reset` (persistent workers draw no seed for a new epoch). An epoch of an odd
  number of calls (its batches and the one that raises StopIteration) put the next epoch's
  rounds one batch off: a 2-epoch recording of a slow worker 1 named worker 1 slow "with
  4.8 ms of waiting against 26.8 ms for the others". (A non-persistent or shuffling loader
  draws a seed as an epoch begins, but so does a loop's own torch.randint: no sign to split
  on.) Where the stalls' place in the round moves for good (ROUND_MOVED_STALLS stalls in a
  row) in a recording seen from its start and made of whole epochs of that length, a new
  epoch began, and the batches from there are numbered from it (alike workers' stalls move
  too, as they drift apart: _first_move, _whole_epochs); where the recording began mid-epoch,
  the place of the stalls in the epochs seen from their start names its batches' workers.
Where the rounds cannot be placed (no epoch seen from its start, or stalls that share no
place) there is no count: the waiting is not split among the workers
(budget.unmodelled_budget), and no finding names a worker or a worker count.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pandas as pd

from .loaders import Loader

# The worker count from the stalls: at least this many stalls in an iterator seen from its
# start, most gaps between consecutive stalls equal to one period, covering most of its rounds.
# A limit of what a trace can tell, measured: stalls that other processes cause recur on a
# period too. A 25-batch recording of 2 alike workers with four `yes` on the 2 cores had 5
# stalls 4 or 5 batches apart, and got num_workers=4 or 5 in 3 runs of 60 (none of 30 with two
# `yes`). More stalls required would lose the short recordings that have a count to find; the
# collector records the count (and each batch's worker) where it matters.
PERIOD_MIN_STALLS = 4
PERIOD_GAP_SHARE = 0.75
PERIOD_COVERAGE = 0.5
PERIOD_MAX = 64
# This many stalls in a row off the slow (or first) worker's place in the round: a new epoch
# began (a single stall off it is a slow batch, which lands anywhere).
ROUND_MOVED_STALLS = 3
# Stalls are told from the other waits by splitting them in two this many times at most (the
# waits above each split split again: _stalls).
STALL_SPLITS = 2
# A new epoch's start is looked for within this many rounds of where its stalls put it
# (_whole_epochs).
EPOCH_SNAP_ROUNDS = 2
EPOCH_PLACE_SHARE = 0.8
# An epoch's place: the one more than half of its first this-many stalls share.
PLACE_STALLS = 2 * ROUND_MOVED_STALLS + 1


@dataclass(frozen=True)
class _Stalls:
    position: np.ndarray  # each call's position in its segment
    segment: np.ndarray
    last: np.ndarray  # its segment's last position
    stalled: np.ndarray  # an inner call (not the first, nor Kineto's StopIteration call) that stalled


def _split_of_logs(waits: np.ndarray) -> float:
    """The wait that best splits `waits` in two by their logarithm (Otsu's: the split with the
    most variance between the two sides)."""
    logs = np.sort(np.log(np.maximum(waits, 1.0)))
    n = len(logs)
    below = np.arange(1, n)  # how many fall below each split
    sums = np.cumsum(logs)[:-1]
    mean_below, mean_above = sums / below, (logs.sum() - sums) / (n - below)
    between = below * (n - below) * (mean_below - mean_above) ** 2
    at = int(np.argmax(between))
    return float(np.exp((logs[at] + logs[at + 1]) / 2))


def _stalls(loader: Loader) -> Iterator[_Stalls]:
    """The loader's calls, and which stalled, from the loosest reading to the strictest: the
    waits beyond twice a ready batch's wait and beyond the best split of the waits in two (the
    stalls of a slow worker or of the batch first in line, one a round, against the rest), then
    beyond the best split of those (with 3 workers on 2 cores the stalls waited 20-50 ms, the
    batch after each 2-4 ms, the ready ones 0.1: the first split, like the median before it,
    took both for stalls, and no period showed). Nothing with too few inner calls to tell."""
    calls = loader.calls
    waits = calls["duration_us"].to_numpy(dtype=np.float64)
    position = calls["index"].to_numpy()
    segment = calls["segment"].to_numpy()
    last = pd.Series(position).groupby(segment).transform("max").to_numpy()
    inner = (position > 0) & (position < last)
    if inner.sum() < PERIOD_MIN_STALLS:
        return
    ready = float(np.quantile(waits[inner], 0.25))
    candidates = waits[inner]
    for _ in range(STALL_SPLITS):
        stalled = inner & (waits > max(2.0 * max(ready, 1.0), _split_of_logs(candidates)))
        if stalled.sum() < PERIOD_MIN_STALLS:
            return
        yield _Stalls(position, segment, last, stalled)
        candidates = waits[stalled]


def _period(found: _Stalls, seen: frozenset[int]) -> int | None:
    """The worker count: the stalls' period in the iterators seen from their start, where one
    shows a clear one."""
    counted: dict[int, int] = {}
    for seg in sorted(seen):  # iterators of a trace: one per recording, a few
        mine = found.segment == seg
        stalls = found.position[mine & found.stalled]
        if len(stalls) < PERIOD_MIN_STALLS:
            continue
        values, counts = np.unique(np.diff(stalls), return_counts=True)
        period = int(values[np.argmax(counts)])
        rounds = (int(found.last[mine].max()) - 1) / max(period, 1)
        if 2 <= period <= PERIOD_MAX and counts.max() >= PERIOD_GAP_SHARE * (len(stalls) - 1) \
                and len(stalls) >= PERIOD_COVERAGE * rounds:
            counted[period] = counted.get(period, 0) + len(stalls)
    return max(counted, key=counted.get) if counted else None


def _place_of_stalls(positions: np.ndarray, workers: int) -> int | None:
    """The place in the round (position mod workers) more than half of the first PLACE_STALLS
    stalls share; None where none does."""
    first = positions[:PLACE_STALLS]
    if len(first) == 0:
        return None
    places = np.bincount(first % workers, minlength=workers)
    place = int(np.argmax(places))
    return place if places[place] * 2 > len(first) else None


def _first_move(stalls: np.ndarray, workers: int, place: int) -> int | None:
    """Where the stalls of a recording seen from its start say a second epoch began: an epoch's
    stalls fall at `place` of its rounds, and ROUND_MOVED_STALLS in a row at another place began
    a new one, whose first round's stall is the first of them (a fresh epoch's first batches are
    not ready ahead: worker `place`'s first one is waited for; if that one was not, the start
    is found a round late, _whole_epochs). None where they never move."""
    moved: list[int] = []
    for at in stalls.tolist():
        if at % workers == place:
            moved = []
            continue
        if moved and (at - moved[0]) % workers:
            moved = []  # not one place: slow batches, not a moved round
        moved.append(at)
        if len(moved) < ROUND_MOVED_STALLS:
            continue
        # (A stall just before it at the old place can be the new epoch's first batch, waiting
        # for its workers' start: 3 ms where ready batches took 0.2.)
        if moved[0] - place >= workers:  # (an epoch is at least one round)
            return moved[0] - place
        moved = []
    return None


def _whole_epochs(moved: int | None, calls: int, stalls: np.ndarray, workers: int, place: int) -> list[int]:
    """The positions the epochs of a recording seen from its start begin at, where its stalls
    moved (`moved`, _first_move): only if the recording is whole epochs of one length (every
    epoch of a loader is its batches and the StopIteration call), found within
    EPOCH_SNAP_ROUNDS rounds of `moved` (its first stall missed: found late; the StopIteration
    call waiting for the workers' shut-down, 28 ms on a busy host, taken for its first stall:
    found early), with the stalls past each epoch's first round at `place` of it
    (EPOCH_PLACE_SHARE of them). Else one epoch: the stalls' place also moves within an epoch,
    workers alike drifting apart on a busy host (a one-epoch recording of 25 calls was cut in
    two at call 12 that way, its first batch's 0.61 s start-up then read as two starts of
    0.31 s)."""
    if moved is None:
        return [0]
    nearest = sorted(range(-EPOCH_SNAP_ROUNDS, EPOCH_SNAP_ROUNDS + 1), key=abs)
    for length in (moved + rounds * workers for rounds in nearest):
        if length < workers or calls % length or calls // length < 2:
            continue
        in_epoch = stalls % length
        steady = in_epoch[in_epoch >= workers]
        if len(steady) and np.mean(steady % workers == place) >= EPOCH_PLACE_SHARE:
            return list(range(0, calls, length))
    return [0]


def inferred_rounds(loader: Loader) -> tuple[int, pd.DataFrame] | None:
    """(the worker count, the loader's calls with `index` each batch's number in its epoch and
    `epoch` the epoch's number in its segment) of a multi-process loader whose trial records
    neither, or None where the stalls do not tell them.

    An epoch seen from its start is numbered from 0. One a recording began in is numbered from
    `workers` or more (no batch of it passes for its epoch's first round), its rounds placed
    where its stalls share the place the seen epochs' stalls share; one with no stall at all is
    numbered from `workers` (nothing of it waits: where its rounds fall changes no part)."""
    for found in _stalls(loader):
        workers = _period(found, loader.seen_from_start)
        if workers is not None:
            break
    else:
        return None
    position, segment, stalled = found.position, found.segment, found.stalled
    index = position.astype(np.int64)
    epoch = np.zeros(len(index), dtype=np.int64)
    bounds = np.r_[0, np.flatnonzero(segment[1:] != segment[:-1]) + 1, len(segment)]  # (in segment order)
    segments = [(lo, hi, int(segment[lo]) in loader.seen_from_start, position[lo:hi][stalled[lo:hi]])
                for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
    # Each seen epoch's place: its stalls' past its first round (start-up's lie anywhere).
    seen_places = {lo: _place_of_stalls(stalls[stalls >= workers], workers)
                   for lo, _hi, seen, stalls in segments if seen}
    if None in seen_places.values():
        return None
    values, counts = np.unique(list(seen_places.values()), return_counts=True)
    common = int(values[np.argmax(counts)]) if counts.max() * 2 > counts.sum() else None
    for lo, hi, seen, stalls in segments:
        if seen:
            place = seen_places[lo]
            bases = np.asarray(_whole_epochs(_first_move(stalls, workers, place), hi - lo, stalls, workers, place))
        elif len(stalls) == 0:
            bases = np.asarray([-workers])
        else:
            first = _place_of_stalls(stalls, workers)
            if first is None or common is None:
                return None
            # A recording begun mid-epoch: at least one round before its first batch.
            bases = np.asarray([-(workers + (common - first) % workers)])
        of = np.searchsorted(bases[1:], position[lo:hi], side="right")
        index[lo:hi] = position[lo:hi] - bases[of]
        epoch[lo:hi] = of
    if not epoch.any() and np.array_equal(index, position):
        return workers, loader.calls
    return workers, loader.calls.assign(index=index, epoch=epoch)
