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
  4.8 ms of waiting against 26.8 ms for the others". Where the stalls' place in the round
  moves for good (ROUND_MOVED_STALLS stalls in a row), a new epoch began, and the batches
  from there are numbered from it; where the recording began mid-epoch, the stalls' place
  in the rounds of the epochs seen from their start names its batches' workers.
Without an epoch seen from its start there is no count: the waiting is not split among the
workers (budget.unmodelled_budget), and no finding names a worker or a worker count.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .loaders import Loader

# The worker count from the stalls: at least this many stalls in an iterator seen from its
# start, most gaps between consecutive stalls equal to one period, covering most of its rounds.
PERIOD_MIN_STALLS = 4
PERIOD_GAP_SHARE = 0.75
PERIOD_COVERAGE = 0.5
PERIOD_MAX = 64
# This many stalls in a row off the slow (or first) worker's place in the round: a new epoch
# began (a single stall off it is a slow batch, which lands anywhere).
ROUND_MOVED_STALLS = 3


def _stalls(loader: Loader) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(each call's position in its segment, its segment, whether it stalled: an inner call that
    waited beyond twice a ready batch's wait and beyond the typical one), or None with too few
    inner calls to tell."""
    calls = loader.calls
    waits = calls["duration_us"].to_numpy(dtype=np.float64)
    position = calls["index"].to_numpy()
    segment = calls["segment"].to_numpy()
    last = pd.Series(position).groupby(segment).transform("max").to_numpy()
    inner = (position > 0) & (position < last)  # not the start, nor Kineto's StopIteration call
    if inner.sum() < PERIOD_MIN_STALLS:
        return None
    ready, high = (float(q) for q in np.quantile(waits[inner], [0.25, 0.9]))
    # Beyond the median wait, or, where half the batches stall (a slow worker of two), beyond
    # the middle of the ready and the stalled waits (the median is then a stall's wait).
    middle = min(float(np.median(waits[inner])), float(np.sqrt(max(ready, 1.0) * max(high, 1.0))))
    threshold = max(2.0 * max(ready, 1.0), middle)
    return position, segment, inner & (waits > threshold)


def infer_workers(loader: Loader) -> int | None:
    """The worker count of a multi-process loader whose trial does not record it, from the
    period of the stalls of its iterators seen from their start; None where none shows a
    clear one."""
    found_stalls = _stalls(loader)
    if found_stalls is None:
        return None
    position, segment, stalled = found_stalls
    last = pd.Series(position).groupby(segment).transform("max").to_numpy()
    found: dict[int, int] = {}
    for seg in sorted(loader.seen_from_start):  # iterators of a trace: one per recording, a few
        mine = segment == seg
        stalls = position[mine & stalled]
        if len(stalls) < PERIOD_MIN_STALLS:
            continue
        values, counts = np.unique(np.diff(stalls), return_counts=True)
        period = int(values[np.argmax(counts)])
        rounds = (int(last[mine].max()) - 1) / max(period, 1)
        if 2 <= period <= PERIOD_MAX and counts.max() >= PERIOD_GAP_SHARE * (len(stalls) - 1) \
                and len(stalls) >= PERIOD_COVERAGE * rounds:
            found[period] = found.get(period, 0) + len(stalls)
    return max(found, key=found.get) if found else None


def _place_of_stalls(positions: np.ndarray, workers: int) -> int | None:
    """The place in the round most of the first ROUND_MOVED_STALLS stalls share, if most do."""
    if len(positions) == 0:
        return None
    places = np.bincount(positions[:ROUND_MOVED_STALLS] % workers, minlength=workers)
    return int(np.argmax(places)) if places.max() * 2 > min(len(positions), ROUND_MOVED_STALLS) else None


def _epoch_bases(stalls: np.ndarray, workers: int, place: int, base: int) -> list[int]:
    """The position each epoch of a segment begins at (the first: `base`), from its stalls'
    positions: an epoch's stalls fall at `place` of its rounds, and ROUND_MOVED_STALLS in a row
    at another place began a new epoch, whose first round's stall is the first of them (a fresh
    epoch's first batches are not ready ahead: worker `place`'s first one is waited for)."""
    bases = [base]
    moved: list[int] = []
    for at in stalls.tolist():
        if (at - base) % workers == place:
            moved = []
            continue
        if moved and (at - moved[0]) % workers:
            moved = []  # not one place: slow batches, not a moved round
        moved.append(at)
        if len(moved) < ROUND_MOVED_STALLS:
            continue
        # (A stall just before it at the old place can be the new epoch's first batch, waiting
        # for its workers' start: 3 ms where ready batches took 0.2.)
        new_base = moved[0] - place
        if new_base >= base + workers:  # (an epoch is at least one round)
            base = new_base
            bases.append(base)
        moved = []
    return bases


def placed_rounds(loader: Loader, workers: int) -> pd.DataFrame:
    """The loader's calls with `index` the batch's number in its epoch as the stalls place it
    (an epoch seen from its start from 0; one a recording began in from `workers` or more, so
    that no batch of it passes for its epoch's first round) and `epoch` the epoch's number in
    its segment. Calls as they were where no stall places them."""
    calls = loader.calls
    found_stalls = _stalls(loader)
    if found_stalls is None or workers < 2:
        return calls
    position, segment, stalled = found_stalls
    seen = np.isin(segment, list(loader.seen_from_start))
    # Where the slow (or first) worker's batches are: the place of the stalls in the epochs
    # seen from their start.
    seen_places = [p for seg in sorted(loader.seen_from_start)
                   if (p := _place_of_stalls(position[(segment == seg) & stalled], workers)) is not None]
    if not seen_places:
        return calls
    place = int(np.bincount(seen_places).argmax())
    index = position.astype(np.int64)
    epoch = np.zeros(len(calls), dtype=np.int64)
    bounds = np.r_[0, np.flatnonzero(segment[1:] != segment[:-1]) + 1, len(segment)]  # (in segment order)
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        stalls = position[lo:hi][stalled[lo:hi]]
        if seen[lo]:
            base = 0
        else:
            first = _place_of_stalls(stalls, workers)
            # A recording begun mid-epoch: at least one round before its first batch.
            base = -(workers + (place - first) % workers) if first is not None else -workers
        bases = np.asarray(_epoch_bases(stalls, workers, place, base))
        of = np.searchsorted(bases[1:], position[lo:hi], side="right")
        index[lo:hi] = position[lo:hi] - bases[of]
        epoch[lo:hi] = of
    if not epoch.any() and np.array_equal(index, position):
        return calls
    return calls.assign(index=index, epoch=epoch)
