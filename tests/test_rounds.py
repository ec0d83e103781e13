"""rounds.py on made-up GetNext waits: the worker count and each batch's place in its epoch's
rounds where a trace records neither (the real torch.profiler runs are in test_verdict_kineto.py;
these pin the cases a run cannot plant on purpose, like two recordings of one loader)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from dashboard.analysis.diagnosis.loaders import Loader, iterator_codes
from dashboard.analysis.diagnosis.rounds import infer_workers, placed_rounds

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


def test_a_recording_begun_mid_epoch_is_placed_by_the_stalls_of_one_seen_from_its_start():
    # Worker 1 slow: its batches (odd in the epoch) stall. The second recording began at an odd
    # batch of the epoch, so its stalls are at even places of the recording.
    seen = _segment(0, 41, lambda p: p % 2 == 1)
    mid = _segment(1, 30, lambda p: (p % 2 == 0) & (p < 29))
    loader = _loader(seen, mid)
    assert infer_workers(loader) == 2
    placed = placed_rounds(loader, 2)
    first, second = placed[placed["segment"] == 0], placed[placed["segment"] == 1]
    assert first["index"].tolist() == list(range(41))
    # Worker 1's place, and at least a round in: none of it passes for the epoch's first round.
    stalls = second[second["duration_us"] == STALL_US]["index"].to_numpy()
    assert (stalls % 2 == 1).all() and second["index"].min() >= 2
    assert np.diff(second["index"].to_numpy()).tolist() == [1] * 29  # numbered on, in order
    assert not placed["epoch"].any()


def test_two_epochs_in_one_recording_are_numbered_each_from_its_start():
    # 26 batches and the StopIteration call an epoch: the second epoch begins at call 27, odd.
    per_epoch = 27
    stalled = lambda p: ((p % per_epoch) % 2 == 1) & ((p % per_epoch) < per_epoch - 1)  # noqa: E731
    loader = _loader(_segment(0, 2 * per_epoch, stalled))
    assert infer_workers(loader) == 2
    placed = placed_rounds(loader, 2)
    assert placed["epoch"].tolist() == [0] * per_epoch + [1] * per_epoch
    assert placed["index"].tolist() == list(range(per_epoch)) * 2
    assert iterator_codes(placed).tolist() == [0] * per_epoch + [1] * per_epoch
    assert Loader.segments.func(_loader(placed)) == 2  # (the iterators the budget counts)


def test_a_few_slow_batches_off_the_round_begin_no_epoch():
    # Two slow batches in a row at the other place: slow samples, not a moved round.
    loader = _loader(_segment(0, 61, lambda p: (p % 2 == 1) | np.isin(p, [20, 22])))
    placed = placed_rounds(loader, 2)
    assert placed is loader.calls  # as they were


def test_no_recording_seen_from_its_start_gives_no_count():
    loader = _loader(_segment(0, 61, lambda p: p % 2 == 0), seen=frozenset())
    assert infer_workers(loader) is None
