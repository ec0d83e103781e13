"""Is the job input-bound: the share of training time the main process waits in GetNext.

Training time is defined once, in `loaders` (the steps' span, each step whole; without
steps the last batch's compute estimated). The classes are those of TensorFlow's
input-pipeline analyzer: >= 20 % highly, >= 5 % moderately, else not input-bound.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...display import duration_s
from .loaders import ProcessTraining

# TensorFlow profiler's input-pipeline analyzer (the best-known one) uses these bounds
# on the share of step time spent waiting for input.
HIGHLY_INPUT_BOUND_PERCENT = 20.0
MODERATELY_INPUT_BOUND_PERCENT = 5.0
CLASS_HIGHLY, CLASS_MODERATELY, CLASS_NOT = "highly", "moderately", "not"


@dataclass(frozen=True)
class Verdict:
    input_percent: float | None  # None: no GetNext to judge by
    class_: str | None  # highly | moderately | not, None with input_percent
    basis: str
    getnext_s: float = 0.0
    training_s: float = 0.0


def classify_input_percent(percent: float | None) -> str | None:
    if percent is None:
        return None
    if percent >= HIGHLY_INPUT_BOUND_PERCENT:
        return CLASS_HIGHLY
    if percent >= MODERATELY_INPUT_BOUND_PERCENT:
        return CLASS_MODERATELY
    return CLASS_NOT


def _estimated(processes: list[ProcessTraining]) -> str:
    if any(n.training_estimated for n in processes):
        return " (estimated where the epoch's end was not recorded: the iterator's median compute)"
    return " (recorded: the next() that ended each epoch)"


def _span(iterators: str, processes: list[ProcessTraining]) -> str:
    """Training time without steps to go by: the iterators' own spans."""
    return f"from the first GetNext of {iterators} to the end of its last batch's compute{_estimated(processes)}"


def _basis(processes: list[ProcessTraining]) -> str:
    iterators = sum(len(n.training_segments) for n in processes)
    stepped = [n for n in processes if n.steps_matched]
    if len(stepped) == len(processes):
        how = (f"over the training steps fed by {iterators} training iterator(s), each step counted "
               f"whole; evaluation iterators told apart by the steps they fed")
    elif stepped:  # a job of processes that record steps and of others that do not (a mixed trial)
        rest = [n for n in processes if not n.steps_matched]
        how = (f"over the training steps on the {len(stepped)} process(es) whose steps the iterators fed; on the "
               f"other {len(rest)}, {_span('each iterator', rest)}, every iterator counting as training; "
               f"{iterators} training iterator(s) in all")
    elif any(n.has_steps and not n.steps_matched for n in processes):
        how = (f"{_span(f'each of {iterators} iterator(s)', processes)}; no iterator fed the training steps, so "
               f"every iterator counts")
    else:
        how = (f"{_span(f'each of {iterators} iterator(s)', processes)}; no step events, so every iterator counts "
               f"as training")
    where = f" on {len(processes)} processes" if len(processes) > 1 else ""
    return how + where


def _make_verdict(getnext_us: int, training_us: int, basis: str) -> Verdict:
    if training_us <= 0:
        return Verdict(None, None, "no GetNext time to judge by" if not getnext_us else basis)
    percent = 100.0 * min(getnext_us, training_us) / training_us
    getnext_s, training_s = getnext_us / 1e6, training_us / 1e6
    return Verdict(round(percent, 2), classify_input_percent(percent),
                   f"GetNext {duration_s(getnext_s)} of {duration_s(training_s)} of training, {basis}",
                   getnext_s, training_s)


def process_verdict(process: ProcessTraining) -> Verdict:
    return _make_verdict(process.training_getnext_us, process.training_us, _basis([process]))


def trial_verdict(processes: list[ProcessTraining]) -> Verdict:
    if not processes:
        return Verdict(None, None, "no GetNext events: nothing to judge by")
    getnext = sum(n.training_getnext_us for n in processes)
    return _make_verdict(getnext, sum(n.training_us for n in processes), _basis(processes))
