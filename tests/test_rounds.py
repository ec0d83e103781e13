"""rounds.py on made-up GetNext waits: the worker count and each batch's place in its epoch's
rounds where a trace records neither (the real torch.profiler runs are in test_verdict_kineto.py;
these pin the cases a run cannot plant on purpose, like two recordings of one loader)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dashboard.analysis.diagnosis.loaders import Loader, iterator_codes
from dashboard.analysis.diagnosis.rounds import inferred_rounds

STALL_US, READY_US = 40_000.0, 200.0


def _segment(segment: int, calls: int, stalled) -> pd.DataFrame:
    position = np.arange(calls)
    return pd.DataFrame({"segment": segment, "index": position,
                         "duration_us": np.where(stalled(position), STALL_US, READY_US)})


def _loader(*segments: pd.DataFrame, seen=frozenset({0})) -> Loader:
    return Loader(process="1-vm", pid=1, cls="enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                  num_workers=None, pin_memory=None, persistent=None, persistent_recorded=False,
                  prefetch_factor=2, in_order=True, calls=pd.concat(segments, ignore_index=True),
                  seen_from_start=frozenset(seen))


@pytest.mark.parametrize("missed", [25, 26, 27])
def test_a_recording_begun_mid_epoch_is_placed_by_the_stalls_of_one_seen_from_its_start(missed):
    # Worker 1 of 4 slow: its batches (1 mod 4 in the epoch) stall. The second recording began
    # `missed` batches into an epoch: its stalls are at (1 - missed) mod 4 of the recording.
    seen = _segment(0, 41, lambda p: (p % 4 == 1) & (p < 40))
    mid = _segment(1, 30, lambda p: ((p + missed) % 4 == 1) & (p < 29))
    workers, placed = inferred_rounds(_loader(seen, mid))
    assert workers == 4
    first, second = placed[placed["segment"] == 0], placed[placed["segment"] == 1]
    assert first["index"].tolist() == list(range(41))
    # Worker 1's place, numbered on in order from at least a round in: none of it passes for
    # the epoch's first round, and the batches keep their distance from the epoch's start mod 4.
    index = second["index"].to_numpy()
    assert ((index - np.arange(30)) % 4 == missed % 4).all() and index.min() >= 4
    assert not placed["epoch"].any()


def test_two_epochs_in_one_recording_are_numbered_each_from_its_start():
    # 26 batches and the StopIteration call an epoch: the second epoch begins at call 27, odd.
    per_epoch = 27
    stalled = lambda p: ((p % per_epoch) % 2 == 1) & ((p % per_epoch) < per_epoch - 1)  # noqa: E731
    loader = _loader(_segment(0, 2 * per_epoch, stalled))
    workers, placed = inferred_rounds(loader)
    assert workers == 2
    assert placed["epoch"].tolist() == [0] * per_epoch + [1] * per_epoch
    assert placed["index"].tolist() == list(range(per_epoch)) * 2
    assert iterator_codes(placed).tolist() == [0] * per_epoch + [1] * per_epoch
    assert Loader.segments.func(_loader(placed)) == 2  # (the iterators the budget counts)


@pytest.mark.parametrize("calls", [25, 54])
def test_stalls_that_move_within_a_recording_of_no_whole_epochs_begin_none(calls):
    # Alike workers drifting apart on a busy host: the stalls move from one place to the other
    # at call 12. No whole epochs of one length end where they moved (25 or 54 calls), so no
    # epoch began there (a real one-epoch recording of 25 calls was cut in two that way).
    stalled = lambda p: (p > 0) & (p < calls - 1) & np.where(p < 12, p % 2 == 1, p % 2 == 0)  # noqa: E731
    loader = _loader(_segment(0, calls, stalled))
    workers, placed = inferred_rounds(loader)
    assert workers == 2 and "epoch" not in placed


def test_slow_batches_off_the_round_begin_no_epoch():
    # Worker 1's batches stall, but 21 is ready and 20 and 22 (worker 0's) are slow: two stalls in
    # a row at the other place, slow samples, not a moved round (three would be one).
    stalled = lambda p: ((p % 2 == 1) & (p != 21) | np.isin(p, [20, 22])) & (p < 60)  # noqa: E731
    loader = _loader(_segment(0, 61, stalled))
    workers, placed = inferred_rounds(loader)
    assert workers == 2 and placed is loader.calls  # as they were


def test_seen_recordings_each_keep_their_own_place():
    # Two recordings seen from their start, the slow worker's stalls at another place in each (a
    # different epoch's shard): neither is split, and a third, begun mid-epoch, cannot be placed.
    odd, even = _segment(0, 41, lambda p: (p % 2 == 1) & (p < 40)), _segment(1, 41, lambda p: (p % 2 == 0) & (p > 0))
    workers, placed = inferred_rounds(_loader(odd, even, seen={0, 1}))
    assert workers == 2 and placed["index"].tolist() == list(range(41)) * 2 and "epoch" not in placed
    mid = _segment(2, 30, lambda p: (p % 2 == 0) & (p < 29))
    assert inferred_rounds(_loader(odd, even, mid, seen={0, 1})) is None  # no place the seen ones share


def test_no_recording_seen_from_its_start_gives_no_count():
    waits = _segment(0, 61, lambda p: (p % 2 == 1) & (p < 60))
    assert inferred_rounds(_loader(waits, seen=frozenset())) is None
    assert inferred_rounds(_loader(waits))[0] == 2  # the same waits, seen from their start


def test_three_levels_of_waits_the_stalls_are_the_highest():
    # 3 workers on 2 cores, worker 2 slow (a real run's waits, rounded): its batches stall 30 ms,
    # the batch after each (worker 0's) waits 2.5 ms for a core, the rest are ready.
    position = np.arange(61)
    waits = np.select([position % 3 == 2, (position % 3 == 0) & (position > 0)], [30_000.0, 2_500.0], 100.0)
    waits[0] = waits[-1] = 100.0
    loader = _loader(pd.DataFrame({"segment": 0, "index": position, "duration_us": waits}))
    workers, placed = inferred_rounds(loader)
    assert workers == 3 and placed is loader.calls
