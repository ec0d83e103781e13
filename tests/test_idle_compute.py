"""The training loop's slower step after a long wait (pipeline._idle_compute): what it measures on
steps made to order, and what a change to no workers does with it on a real recording."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dashboard
from dashboard.analysis.diagnosis import pipeline

RECORDING = Path(__file__).parent / "recordings" / "slow_worker_busy_moment"
WORKERS = 4
STEP_US, NOISE_US, SLOWER_US, LONG_WAIT_US, STORED_US = 6_000.0, 300.0, 3_000.0, 100_000.0, 100.0


def steps(batches: int, segments: int = 2, slower_us: float = SLOWER_US, where=None, seed: int = 1):
    """A loader like the slow_worker job's: every 4th next() waits 100 ms, the others find their
    batch stored; the step after a long wait takes `slower_us` more (where `where`(index) holds)."""
    rng = np.random.default_rng(seed)
    per = batches // segments
    segment = np.repeat(np.arange(segments), per)
    index = np.tile(np.arange(per), segments)
    long = index % WORKERS == 1
    wait = np.where(long, LONG_WAIT_US, STORED_US)
    slowed = long & (where(index) if where is not None else True)
    compute = STEP_US + rng.normal(0.0, NOISE_US, len(index)) + np.where(slowed, slower_us, 0.0)
    return compute, wait, index, segment


def measure(compute, wait, index, segment, startup_rows=None):
    segments = int(segment.max()) + 1
    rows = np.zeros(segments, dtype=np.int64) if startup_rows is None else startup_rows
    return pipeline._idle_compute(compute, wait, index, segment, WORKERS, rows, STORED_US, float(np.mean(compute)))


def test_the_step_after_a_long_wait_is_measured_slower_by_what_it_took():
    shift, full_at = measure(*steps(400))
    assert shift == pytest.approx(SLOWER_US, rel=0.1)
    assert full_at == LONG_WAIT_US


def test_steps_alike_after_any_wait_give_none():
    assert measure(*steps(400, slower_us=0.0)) == (0.0, 0.0)


def test_a_shift_too_small_to_matter_gives_none():
    # Told from noise over 100,000 steps, and above READY_SLACK_US, but under IDLE_MIN_SHARE of a step.
    assert measure(*steps(100_000, slower_us=0.04 * STEP_US)) == (0.0, 0.0)


def test_a_large_loader_is_read_at_random_not_in_step_with_its_waits():
    # 4 x IDLE_SAMPLE steps: a stride of 4 would read only one phase of the 4-batch period.
    assert len(steps(4 * pipeline.IDLE_SAMPLE)[0]) > pipeline.IDLE_SAMPLE
    shift, _ = measure(*steps(4 * pipeline.IDLE_SAMPLE))
    assert shift == pytest.approx(SLOWER_US, rel=0.1)


def test_the_steps_the_start_up_counts_are_left_out():
    # Slower only in each iterator's first half: what _startup_compute counts, where workers start.
    early = steps(400, where=lambda index: index < 100)
    assert measure(*early)[0] > 0
    assert measure(*early, startup_rows=np.array([100, 100])) == (0.0, 0.0)


def test_a_change_to_no_workers_takes_no_idle_compute_off():
    # The training process then loads each batch itself, never idle in next(): the model knows
    # nothing of what that costs its steps and keeps today's charge (0.15 s on this recording).
    result = dashboard.analyze(str(RECORDING))
    (model,) = result.assessment.models
    budget = result.budget[0]
    assert model.today_idle_charged_us > 100_000
    for change, spared in (({"num_workers": 0}, False), ({"num_workers": 8}, True)):
        (then,) = result.what_if(change)
        wait_s = then.predicted["wait_fraction"] * then.predicted["training_s"]
        compute_saved_s = budget.training_s - (budget.wait_s - wait_s) - then.predicted["training_s"]
        # (rounding: the prediction's 6 decimals; today's replay and today's waits charge it a few ms apart)
        assert (compute_saved_s > 0.05) == spared, (change, compute_saved_s)
