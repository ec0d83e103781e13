"""The slow_worker finding's prediction of its own fix, against re-runs: a real recording of
tests/scenario_job.py's slow_worker job (the collector's trial, quiet host, on a moment the host
ran slower: tests/recordings/README.md), with the books of the two re-runs made right after it
with the slow worker as fast as the others, and the first of those re-runs' trial.

Two things the planted run shows that its fix changes, each checked against books:
- a next() whose batch is already in the result queue costs less than one that waits for it.
  The planted job receives only the batches it waits for (every other worker's are stored
  meanwhile), and those paid for being woken too: 6.8 ms a next() on this run, where the
  re-runs' next()s took 2.7-3.4 ms. With its worker fixed nearly every batch is there at the ask.
- the training loop's step after its 100 ms waits ran slower than the steps between (the loop's
  own books: 4.7 ms); with the waits gone, so is that.
Charged the waited-for cost, and keeping the slower steps, the prediction overshot the re-runs'
training by 34 %."""
from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

import dashboard
from dashboard.analysis.diagnosis import pipeline, what_if

RECORDINGS = Path(__file__).parent / "recordings"
PLANTED = RECORDINGS / "slow_worker_busy_moment"
RERUN = RECORDINGS / "slow_worker_fixed_rerun"
# Where the planted run received too few batches that were there (its own cost is the midpoint
# of the stored and the waited-for path): against the fixed runs' books' mean hand-over, of every
# next(), stored ones (0.1-0.2 ms) among them. Over 20 planted runs (12 quiet, 8 busy), each against
# the mean of the two fixed runs of its A B B A group: 0.60-1.29x.
READY_COST_SPREAD = 0.5
# Where the trial measured them (the re-run: 130 of 144): against the books' mean of the next()s
# whose batch was collated before they asked, which counts the stored ones too (12 here, 0.7 ms).
MEASURED_READY_SPREAD = 0.2
# The model's idle compute against the books' (medians of steps after a wait longer than the mean
# step and of the other steady steps): 0.96-1.00x in 12 quiet planted runs and 4 of 8 with two
# `yes` (in the other 4 it was not told from noise: the books' 1.0-1.6 ms). The collector's step
# runs from one GetNext's end to the next one's start, the books' from next()'s return to the
# loop's end: a few us apart.
IDLE_SPREAD = 0.1
# The finding's prediction of training with the worker fixed, over 10 groups A B B A (6 quiet,
# 4 busy): 0.90-1.28x the re-runs' mean (what is left is the planted runs' slower compute
# between the waits).
PREDICTION_SPREAD = 0.3


def reruns() -> list[dict]:
    return json.loads((PLANTED / "fixed_worker_reruns.json").read_text())["runs"]


def books(folder: Path) -> dict:
    return json.loads((folder / "books.json").read_text())


@pytest.fixture(scope="module")
def result():
    return dashboard.analyze(str(PLANTED))


def test_a_next_whose_batch_was_there_is_charged_what_such_a_next_cost(result):
    (model,) = result.assessment.models
    measured_us = 1e6 * statistics.mean(run["handover_mean_s"] for run in reruns())
    # (the waited-for cost this run measured is twice that: charged to every batch, it was 2.2x)
    assert model.waited_us > 1.8 * measured_us, (model.waited_us, measured_us)
    assert model.ready_us == pytest.approx(measured_us, rel=READY_COST_SPREAD), (model.ready_us, measured_us)


def test_where_the_trial_measured_such_next_calls_their_cost_is_theirs():
    rerun = books(RERUN)
    waits, handovers = np.array(rerun["waits_s"]), np.array(rerun["handovers_s"])
    there = np.isclose(waits, handovers, rtol=0, atol=1e-6)  # collated before next() asked
    (model,) = dashboard.analyze(str(RERUN)).assessment.models
    assert there.sum() > pipeline.MIN_RECEIVED * 10
    assert model.ready_us == pytest.approx(1e6 * handovers[there].mean(), rel=MEASURED_READY_SPREAD)


def test_the_step_after_a_long_wait_is_measured_slower_as_the_books_saw_it(result):
    planted = books(PLANTED)
    settings = planted["settings"]
    waits, steps = np.array(planted["waits_s"]) * 1e6, np.array(planted["steps_s"]) * 1e6
    steady = np.arange(len(waits)) % settings["batches"] >= settings["num_workers"]
    long = steady & (waits > steps.mean())
    books_idle_us = float(np.median(steps[long]) - np.median(steps[steady & ~long]))
    (model,) = result.assessment.models
    assert books_idle_us > 2_000  # (what the recording shows: 4.7 ms)
    assert model.idle_compute_us == pytest.approx(books_idle_us, rel=IDLE_SPREAD), (
        model.idle_compute_us, books_idle_us)
    assert model.idle_full_wait_us == pytest.approx(float(np.median(waits[long])), rel=IDLE_SPREAD)


def test_the_slow_worker_made_as_fast_is_predicted_as_its_re_runs_trained(result):
    (model,) = result.assessment.models
    assert model.service_measured  # (else the prediction is the budget's part taken off)
    (found,) = [r for r in result.recommendations if r.id == "slow_worker"]
    predicted_s = found.evidence["fixed_worker_predicted"]["training_s"]
    measured_s = statistics.mean(run["training_s"] for run in reruns())
    # (charged the waited-for cost and keeping the slower steps: 2.70 s against 2.01 s, 1.34x)
    assert predicted_s == pytest.approx(measured_s, rel=PREDICTION_SPREAD), (predicted_s, measured_s)

    # Each of the two does its share: without the idle compute the prediction is further off.
    without = dataclasses.replace(model, idle_compute_us=0.0, today_idle_charged_us=0.0)
    without.today_us = pipeline.replay(without, without.settings).wait_us
    worker = found.evidence["worker_id"]
    kept_s = what_if.predict_worker_as_fast(without, result.budget[0], worker)["training_s"]
    assert abs(kept_s - measured_s) > abs(predicted_s - measured_s) + 0.05, (kept_s, predicted_s, measured_s)
