"""Is the job input-bound: the share of training time the main process waits in GetNext.

Training time is defined once, in `loaders` (the steps' span, each step whole; without
steps the last batch's compute estimated). The classes are those of TensorFlow's
input-pipeline analyzer: >= 20 % highly, >= 5 % moderately, else not input-bound.
"""
from __future__ import annotations

from dataclasses import dataclass

from .loaders import Node

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


def _estimated(nodes: list[Node]) -> str:
    if any(n.training_estimated for n in nodes):
        return " (estimated where the epoch's end was not recorded: the iterator's median compute)"
    return " (recorded: the next() that ended each epoch)"


def _basis(nodes: list[Node]) -> str:
    iterators = sum(len(n.training_segments) for n in nodes)
    if all(n.steps_matched for n in nodes):
        how = (f"over the training steps fed by {iterators} training iterator(s), each step counted "
               f"whole; evaluation iterators told apart by the steps they fed")
    elif any(n.has_steps and not n.steps_matched for n in nodes):
        how = (f"from the first GetNext of each of {iterators} iterator(s) to the end of its last batch's "
               f"compute{_estimated(nodes)}; no iterator fed the training steps, so every iterator counts")
    else:
        how = (f"from the first GetNext of each of {iterators} iterator(s) to the end of its last batch's "
               f"compute{_estimated(nodes)}; no step events, so every iterator counts as training")
    where = f" on {len(nodes)} nodes" if len(nodes) > 1 else ""
    return how + where


def _make_verdict(getnext_us: int, training_us: int, basis: str) -> Verdict:
    if training_us <= 0:
        return Verdict(None, None, "no GetNext time to judge by" if not getnext_us else basis)
    percent = 100.0 * min(getnext_us, training_us) / training_us
    getnext_s, training_s = getnext_us / 1e6, training_us / 1e6
    return Verdict(round(percent, 2), classify_input_percent(percent),
                   f"GetNext {getnext_s:.3f} s of {training_s:.3f} s of training, {basis}",
                   getnext_s, training_s)


def node_verdict(node: Node) -> Verdict:
    getnext = int(node.training_calls["duration_us"].sum())
    return _make_verdict(getnext, node.training_us, _basis([node]))


def trial_verdict(nodes: list[Node]) -> Verdict:
    if not nodes:
        return Verdict(None, None, "no GetNext events: nothing to judge by")
    getnext = sum(int(n.training_calls["duration_us"].sum()) for n in nodes)
    return _make_verdict(getnext, sum(n.training_us for n in nodes), _basis(nodes))
