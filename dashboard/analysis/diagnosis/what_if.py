"""What-if: DataLoader settings in, predicted wait and training time out.

A change is a dict of the settings the pipeline model replays: num_workers,
prefetch_factor, in_order, persistent_workers. The prediction is the replay under the
changed settings, scaled by today's measured wait over today's replay (see _calibrated);
the compute between batches is the same (but for what persistent workers spare after each
start), so training time falls by the seconds the wait does. A loader without a recorded worker count cannot be replayed: its
prediction is None, and says why.
"""
from __future__ import annotations

from dataclasses import dataclass

from .budget import LoaderBudget
from .pipeline import PipelineModel, replay

# Bounds a user can ask for: torch accepts more, no host has use for them.
MAX_WORKERS = 256
MAX_PREFETCH = 64
_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
KEYS = ("num_workers", "prefetch_factor", "in_order", "persistent_workers")


def _as_int(key: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{key} must be a whole number, not {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{key} must be a whole number, not {value!r}") from None
    if not low <= number <= high:
        raise ValueError(f"{key} must be between {low} and {high}, not {number}")
    return number


def _as_bool(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOLS:
        return _BOOLS[value.strip().lower()]
    raise ValueError(f"{key} must be true or false, not {value!r}")


def validate(change: dict) -> dict:
    """The change with typed values, or ValueError naming the first bad key or value."""
    if not isinstance(change, dict) or not change:
        raise ValueError("a what-if needs at least one setting, e.g. num_workers=8")
    out = {}
    for key, value in change.items():
        if key == "num_workers":
            out[key] = _as_int(key, value, 0, MAX_WORKERS)
        elif key == "prefetch_factor":
            out[key] = _as_int(key, value, 1, MAX_PREFETCH)
        elif key in ("in_order", "persistent_workers"):
            out[key] = _as_bool(key, value)
        else:
            raise ValueError(f"unknown what-if setting {key!r}: use " + ", ".join(KEYS))
    return out


def parse(text: str) -> dict:
    """'num_workers=8,in_order=false' -> {'num_workers': 8, 'in_order': False}."""
    change = {}
    for item in str(text).split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            raise ValueError(f"what-if {text!r}: write settings as key=value[,key=value], "
                             f"e.g. num_workers=8,in_order=false")
        if key in change:
            raise ValueError(f"what-if {text!r}: {key} is given twice")
        change[key] = value.strip()
    return validate(change)


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


def predict(model: PipelineModel | None, budget: LoaderBudget, change: dict) -> WhatIf:
    change = validate(change)
    now = {"wait_fraction": _fraction(budget.wait_s, budget.training_s), "training_s": budget.training_s}
    if model is None:
        return WhatIf(budget.node, budget.process, budget.loader, change, now, None,
                      "the trial does not record this loader's num_workers: it cannot be replayed")
    settings = model.settings.changed(change)
    wait = _calibrated(budget.wait_s * 1e6, model.today_us, replay(model, settings)) / 1e6
    saved = budget.wait_s - wait
    # Workers that start once also spare the main process's slower compute after each start.
    compute_saved = 0.0
    if settings.persistent_workers and not model.settings.persistent_workers and settings.num_workers:
        compute_saved = model.startup_compute_us * max(int(model.recreated.sum()) - 1, 0) / 1e6
    training = max(budget.training_s - saved - compute_saved, 1e-9)
    note = "" if model.service_measured else "service times inferred from the main process's waits (an estimate)"
    return WhatIf(budget.node, budget.process, budget.loader, change, now,
                  {"wait_fraction": _fraction(wait, training), "training_s": round(training, 6)}, note)
