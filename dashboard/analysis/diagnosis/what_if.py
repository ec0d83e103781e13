"""What-if: DataLoader settings in, predicted wait and training time out.

A change is a dict of the settings the pipeline model replays: num_workers,
prefetch_factor, in_order, persistent_workers. The prediction is the replay under the
changed settings, scaled by today's measured wait over today's replay (see _calibrated);
the compute between batches is the same (but for what persistent workers spare after each
start, and the slower steps after long waits that the change shortens or lengthens:
pipeline._idle_compute), so training time falls by the seconds the wait does. A loader without a
recorded worker count cannot be replayed: its prediction is None, and says why.
predict_worker_as_fast predicts one change to the job itself: a slow worker made as fast as the
others.
"""
from __future__ import annotations

from dataclasses import dataclass, replace as replaced

import numpy as np

from ...what_if_settings import validate
from .budget import LoaderBudget
from .pipeline import PipelineModel, Replayed, replay


@dataclass
class WhatIf:
    node: str  # the host
    process: str
    loader: str
    change: dict
    now: dict  # wait_fraction, training_s
    predicted: dict | None  # None: the model cannot replay this loader
    note: str = ""

    @property
    def saving_s(self) -> float | None:
        return None if self.predicted is None else round(self.now["training_s"] - self.predicted["training_s"], 6)


# How far today's measured wait may be from today's replay and still scale the prediction:
# beyond it the model explains too little of the wait for a ratio to mean anything, and the
# difference is carried over as it is instead.
MAX_CALIBRATION = 2.0


def _calibrated(measured_us: float, today_us: float, changed_us: float) -> float:
    """The changed setting's wait: its replay times today's measured / replayed wait. The
    part of the wait the model does not produce (the budget's residual: on a busy host, the
    main process's wake-ups and the workers' hand-overs) is in proportion to the waiting it
    does: more workers, fewer waits, less of it too."""
    if today_us > 0 and 1 / MAX_CALIBRATION <= measured_us / today_us <= MAX_CALIBRATION:
        return changed_us * measured_us / today_us
    return max(measured_us - (today_us - changed_us), 0.0)


def _fraction(wait_s: float, training_s: float) -> float:
    return round(wait_s / training_s, 6) if training_s > 0 else 0.0


def today(budget: LoaderBudget) -> dict:
    """What a prediction starts from: the loader's measured wait fraction and training time."""
    return {"wait_fraction": _fraction(budget.wait_s, budget.training_s), "training_s": budget.training_s}


def predict_worker_as_fast(model: PipelineModel | None, budget: LoaderBudget, worker: int) -> dict:
    """The prediction ({"wait_fraction", "training_s"}) with `worker` made as fast as the others:
    the slow_worker finding's own fix, a change to the job (its data, its sampler), not to a
    setting.

    Where the collector measured the fetch times, the model is replayed with the worker's speed
    the others' median and calibrated as a setting's what-if: the other workers then set the
    pace, and where they barely keep up with the loop the wait falls by less than the imbalance
    part. (Re-runs of the slow_worker scenario with the worker fixed, 4 groups A B B A each way:
    the part alone predicted 0.09-0.16 too little of training waiting, quiet and loaded. This,
    over 10 such groups (6 quiet, 4 with two `yes`): 0.02-0.08 too little, and training 10 % under
    to 28 % over theirs, where the planted runs' loop computed slower than the re-runs' between
    its waits (see the README). tests/test_diagnosis_scenarios.py re-runs it.) Without fetch
    times a worker's slowness is known from its batches' waits alone, which the model's inferred
    service times spread over every worker (a replay then saved nothing on planted trials of a
    slow worker): the prediction is the budget's imbalance part taken off, all the trial says
    (torch.profiler recordings, 2 workers, worker 1 15 ms a sample: the part 108-110 ms, fixing
    it saved 90-107 ms)."""
    if model is not None and model.service_measured and 0 <= worker < len(model.speed) and len(model.speed) > 1:
        speed = model.speed.copy()
        speed[worker] = float(np.median(np.delete(speed, worker)))
        return _from_replay(model, budget, replay(replaced(model, speed=speed), model.settings))
    return _predicted(budget, max(budget.wait_s - budget.parts["imbalance"], 0.0))


def _from_replay(model: PipelineModel, budget: LoaderBudget, changed: Replayed, compute_saved_s: float = 0.0) -> dict:
    """The prediction from a replay of a change: its wait calibrated to today's, and the idle
    compute of the steps after its waits against today's replay's (pipeline._idle_compute: less
    where the change shortens long waits, more where it lengthens them)."""
    wait = _calibrated(budget.wait_s * 1e6, model.today_us, changed.wait_us) / 1e6
    return _predicted(budget, wait, compute_saved_s + (model.today_idle_charged_us - changed.idle_charged_us) / 1e6)


def _predicted(budget: LoaderBudget, wait_s: float, compute_saved_s: float = 0.0) -> dict:
    """A prediction from the loader's predicted wait: the compute between batches stays (but for
    `compute_saved_s`, less where a change costs compute), so training falls by the seconds the
    wait does."""
    training = max(budget.training_s - (budget.wait_s - wait_s) - compute_saved_s, 1e-9)
    return {"wait_fraction": _fraction(wait_s, training), "training_s": round(training, 6)}


def predict(model: PipelineModel | None, budget: LoaderBudget, change: dict) -> WhatIf:
    change = validate(change)
    now = today(budget)
    if model is None:
        return WhatIf(budget.node, budget.process, budget.loader, change, now, None,
                      "the trial does not record this loader's num_workers: it cannot be replayed")
    settings = model.settings.changed(change)
    # Workers that start once also spare the main process's slower compute after each start.
    compute_saved = 0.0
    if settings.persistent_workers and not model.settings.persistent_workers and settings.num_workers:
        # (the starts after the first iterator's: its own, where the recording saw one, stays)
        compute_saved = model.startup_compute_us * int(model.recreated[1:].sum()) / 1e6
    note = "" if model.service_measured else "service times inferred from the main process's waits (an estimate)"
    return WhatIf(budget.node, budget.process, budget.loader, change, now,
                  _from_replay(model, budget, replay(model, settings), compute_saved), note)
