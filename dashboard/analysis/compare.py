"""Two runs of a job side by side: did the change do what the first run's what-if said?

    compare(Side(assessment_a, framework_a), Side(assessment_b, framework_b)) -> Comparison
        .delta              B minus A: training time, wait (GetNext) and input-bound percent
        .settings_changed   per training loader, the DataLoader settings that differ
        .findings           each finding of either run: resolved, remaining or new (not_judged:
                            A's, where B trained no loader the diagnosis could assess)
        .predicted          A's what-if for B's changed settings; where none changed, A's
                            predictions for the slow workers B no longer has (None: nothing to predict)
        .achieved           what B measured, on the same basis as the prediction

Loaders are matched by process and iterator class (the loader's label also names its worker
count, which a change may alter); processes by their id when both runs have the same ones
(ranks), else by host and rank (an id that is a pid differs from run to run); loaders left
over by iterator class alone (the other run went to another host). A setting
counts as recorded when the run's iterator initializations record it; `persistent_workers`
also when the diagnosis saw it from re-creations (fewer initializations than iterators).
What only one run records is listed with "not recorded" on the other side, and is never
part of a prediction. Pure: assessments and frames in, a result out.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from .. import format as fmt
from .dataloader import iterator_classes
from .diagnosis import WHAT_IF_KEYS, Assessment, LoaderBudget
from .diagnosis.what_if import predict_worker_as_fast
from ..trial.load import processes_of

NOT_RECORDED = "not recorded"
# The DataLoader settings compared, in the order they are listed. The what-if replays all but
# pin_memory (WHAT_IF_KEYS).
SETTINGS = ("num_workers", "pin_memory", "prefetch_factor", "in_order", "persistent_workers")
RESOLVED, REMAINING, NEW = "resolved", "remaining", "new"
# A's finding where B trained no loader the diagnosis could assess (no GetNext recorded, system
# metrics alone): B says nothing of it, which is not its fix.
NOT_JUDGED = "not_judged"
STATUS_WORDS = {RESOLVED: "resolved", REMAINING: "remaining", NEW: "new", NOT_JUDGED: "not judged"}
SLOW_WORKER = "slow_worker"  # the finding whose fix, the worker made as fast as the others, A predicts
# A budget's loader label is '<iterator class> (num_workers=...)' (diagnosis.loaders.Loader.label).


@dataclass(frozen=True)
class Side:
    """One run: its assessment and its canonical framework frame (whose iterator
    initializations say which settings the run recorded)."""
    assessment: Assessment
    framework: pd.DataFrame


@dataclass(frozen=True)
class SettingChange:
    node: str  # the host
    loader: str  # the iterator class
    key: str
    a: object  # the value, or NOT_RECORDED
    b: object


@dataclass(frozen=True)
class FindingStatus:
    id: str
    loader: str | None  # the iterator class the finding is about
    status: str  # resolved | remaining | new | not_judged
    saving_s_a: float | None
    saving_s_b: float | None
    text_a: str | None = None
    text_b: str | None = None


@dataclass
class LoaderPair:
    """A training loader of A and its counterpart in B (None: it trained in one run only)."""
    node: str
    loader: str  # the iterator class
    a: LoaderBudget | None
    b: LoaderBudget | None
    settings_a: dict = field(default_factory=dict)  # SETTINGS -> value or NOT_RECORDED
    settings_b: dict = field(default_factory=dict)


@dataclass
class Comparison:
    delta: dict  # training_s, wait_s, input_percent: B - A (None where a run has no verdict)
    settings_changed: list[SettingChange]
    findings: list[FindingStatus]
    predicted: dict | None  # change, fixes, training_s, wait_fraction
    achieved: dict  # training_s, wait_fraction
    loaders: list[LoaderPair]
    note: str = ""  # why there is no prediction, when there is none


def _matcher(a: Side, b: Side):
    """How loaders' processes are matched: by process id when the runs share their ids (ranks
    of a distributed job), else by host and rank (a process id that is a pid differs from run
    to run)."""
    if {item.process for item in a.assessment.budget} == {item.process for item in b.assessment.budget}:
        return lambda side, item: item.process
    ranks_a, ranks_b = ({p.id: p.rank for p in processes_of(side.framework)} for side in (a, b))
    return lambda side, item: (item.node, (ranks_a if side is a else ranks_b).get(item.process))


def _inits(framework: pd.DataFrame) -> pd.DataFrame:
    inits = framework[(framework["kind"] == fmt.KIND_INIT).to_numpy()]
    return inits.assign(cls=iterator_classes(inits["name"]).to_numpy())


def _recorded_value(rows: pd.DataFrame, column: str):
    values = rows[column].dropna()
    if values.empty:
        return NOT_RECORDED
    value = values.iloc[-1]
    return bool(value) if column in ("pin_memory", "in_order", "persistent_workers") else int(value)


def loader_settings(item: LoaderBudget, inits: pd.DataFrame) -> dict:
    """A training loader's DataLoader settings as the run recorded them (NOT_RECORDED where
    its iterator initializations do not say), persistence also as re-creations show it, and a
    single-process iterator's num_workers (0) as its class says it."""
    rows = inits[((inits["cls"] == item.iterator)
                  & (inits["process"].astype(str) == item.process)).to_numpy()]
    workers = item.evidence.get("num_workers")
    if workers is not None and rows["num_workers"].notna().any():
        same = rows[(rows["num_workers"] == workers).fillna(False).to_numpy()]
        rows = same if len(same) else rows
    out = {}
    for key in SETTINGS:
        recorded = _recorded_value(rows, key)
        if key == "persistent_workers":
            seen = item.evidence.get("persistent_workers")  # recorded, or seen from re-creations
            out[key] = NOT_RECORDED if seen is None else bool(seen)
        elif key == "num_workers" and recorded == NOT_RECORDED and fmt.SINGLE_PROCESS_ITER in item.iterator:
            out[key] = 0  # its class says so, recorded or not
        elif key == "pin_memory" or recorded == NOT_RECORDED:
            out[key] = recorded
        else:
            # The diagnosis's own value of the loader (what its what-if starts from).
            value = item.evidence.get(key)
            out[key] = recorded if value is None else (bool(value) if key == "in_order" else int(value))
    return out


def _pairs(a: Side, b: Side) -> list[LoaderPair]:
    """A's training loaders with their counterparts in B: the same process (see _matcher) and
    iterator class; then, for those left, the same iterator class anywhere (the runs went to
    other hosts: a job run again elsewhere, a trace recorded on another machine)."""
    key_of = _matcher(a, b)
    inits_a, inits_b = _inits(a.framework), _inits(b.framework)
    left: dict[tuple, list[LoaderBudget]] = {}
    for item in b.assessment.budget:
        left.setdefault((key_of(b, item), item.iterator), []).append(item)
    matched = []
    for item in a.assessment.budget:
        key = (key_of(a, item), item.iterator)
        matched.append([item, left[key].pop(0) if left.get(key) else None])
    by_class: dict[str, list[LoaderBudget]] = {}
    for (_, cls), items in left.items():
        by_class.setdefault(cls, []).extend(items)
    for pair in matched:
        cls = pair[0].iterator
        if pair[1] is None and by_class.get(cls):
            pair[1] = by_class[cls].pop(0)
    pairs = [LoaderPair(item.node, item.iterator, item, other, loader_settings(item, inits_a),
                        loader_settings(other, inits_b) if other is not None else {}) for item, other in matched]
    for cls, items in by_class.items():
        pairs += [LoaderPair(item.node, cls, None, item, {}, loader_settings(item, inits_b)) for item in items]
    return pairs


def _changes(pairs: list[LoaderPair]) -> list[SettingChange]:
    out = []
    for pair in pairs:
        if pair.a is None or pair.b is None:
            continue
        for key in SETTINGS:
            va, vb = pair.settings_a[key], pair.settings_b[key]
            if va != vb:
                out.append(SettingChange(pair.node, pair.loader, key, va, vb))
    return out


def what_if_change(pair: LoaderPair) -> dict:
    """B's settings that differ from A's and that the what-if replays, both recorded."""
    if pair.a is None or pair.b is None:
        return {}
    return {key: pair.settings_b[key] for key in WHAT_IF_KEYS
            if NOT_RECORDED not in (pair.settings_a[key], pair.settings_b[key])
            and pair.settings_a[key] != pair.settings_b[key]}


def _fraction(wait_s: float, training_s: float) -> float | None:
    return round(wait_s / training_s, 6) if training_s > 0 else None


def _predicted(a: Side, b: Side, pairs: list[LoaderPair]) -> tuple[dict | None, str]:
    """A's what-if for B's settings: each changed loader of A replayed with its change, the
    others as they are; together, as the budgets add up. Where no setting changed, A's
    predictions for the slow workers B no longer has (_fixes_predicted)."""
    budget = a.assessment.budget
    changes = {id(pair.a): what_if_change(pair) for pair in pairs if pair.a is not None}
    if not any(changes.values()):
        # Only where nothing else differs either: a setting the what-if does not replay
        # (pin_memory), or one only one run records, could be what removed the slow worker.
        fixed = _fixes_predicted(a, b, pairs) if not _changes(pairs) else None
        if fixed is not None:
            return fixed, ""
        return None, "no DataLoader setting the what-if replays differs between the runs (where both record it)"
    predictions: dict[tuple, list] = {}
    training = wait = 0.0
    merged: dict = {}
    for index, item in enumerate(budget):
        change = changes.get(id(item)) or {}
        if not change:
            training, wait = training + item.training_s, wait + item.wait_s
            continue
        key = tuple(sorted(change.items()))
        if key not in predictions:
            try:
                predictions[key] = a.assessment.predict(change)
            except ValueError as exc:
                return None, f"the what-if cannot replay {change}: {exc}"
        result = predictions[key][index]
        if result.predicted is None:
            return None, f"{item.loader} on {item.node}: {result.note}"
        then = result.predicted
        training += then["training_s"]
        wait += then["wait_fraction"] * then["training_s"]
        merged.update(change)
    return {"change": merged, "fixes": [], "training_s": round(training, 6),
            "wait_fraction": _fraction(wait, training)}, ""


def _fixes_predicted(a: Side, b: Side, pairs: list[LoaderPair]) -> dict | None:
    """Where no DataLoader setting changed: A's loaders with a slow worker (A's budget names it,
    and A has the slow_worker finding of its iterator class) that B's counterpart no longer has
    (the job itself was changed: its data, its sampler), each predicted as the finding predicts
    it, with the worker made as fast as the others (diagnosis.what_if.predict_worker_as_fast),
    the others as they are; None when there is none. By the budgets, not the findings: the
    findings keep one slow_worker per iterator class of the whole job (the process where it
    saves most), so a rank's own is not among them."""
    found = {item.evidence.get("loader") for item in a.assessment.recommendations if item.id == SLOW_WORKER}
    models = {id(item): model for model, item in zip(a.assessment.models, a.assessment.budget)}
    training = wait = 0.0
    fixes = []
    for pair in pairs:
        if pair.a is None:
            continue
        worker = pair.a.slow_worker
        if worker is None or pair.a.iterator not in found or pair.b is None or pair.b.slow_worker is not None:
            training, wait = training + pair.a.training_s, wait + pair.a.wait_s
            continue
        then = predict_worker_as_fast(models[id(pair.a)], pair.a, worker)
        training += then["training_s"]
        wait += then["wait_fraction"] * then["training_s"]
        fixes.append({"finding": SLOW_WORKER, "node": pair.node, "loader": pair.a.loader, "worker_id": int(worker)})
    if not fixes:
        return None
    return {"change": {}, "fixes": fixes, "training_s": round(training, 6), "wait_fraction": _fraction(wait, training)}


def _achieved(b: Side) -> dict:
    training = sum(item.training_s for item in b.assessment.budget)
    wait = sum(item.wait_s for item in b.assessment.budget)
    return {"training_s": round(training, 6) if b.assessment.budget else None,
            "wait_fraction": _fraction(wait, training)}


def _delta(a: Side, b: Side) -> dict:
    va, vb = a.assessment.verdict, b.assessment.verdict
    if va.input_percent is None or vb.input_percent is None:
        return {"training_s": None, "wait_s": None, "input_percent": None}
    return {"training_s": round(vb.training_s - va.training_s, 6), "wait_s": round(vb.getnext_s - va.getnext_s, 6),
            "input_percent": round(vb.input_percent - va.input_percent, 2)}


def _findings(a: Side, b: Side) -> list[FindingStatus]:
    def key(item):
        return item.id, item.evidence.get("loader")

    later = {}
    for item in b.assessment.recommendations:
        later.setdefault(key(item), item)
    out, seen = [], set()
    gone = RESOLVED if b.assessment.budget else NOT_JUDGED
    for item in a.assessment.recommendations:
        if key(item) in seen:
            continue
        seen.add(key(item))
        other = later.get(key(item))
        out.append(FindingStatus(item.id, item.evidence.get("loader"), REMAINING if other else gone,
                                 item.saving_s, other.saving_s if other else None, item.text,
                                 other.text if other else None))
    for item in b.assessment.recommendations:
        if key(item) not in seen:
            seen.add(key(item))
            out.append(FindingStatus(item.id, item.evidence.get("loader"), NEW, None, item.saving_s, None, item.text))
    return out


def compare(a: Side, b: Side) -> Comparison:
    """B against A (A: the run before the change)."""
    pairs = _pairs(a, b)
    predicted, note = _predicted(a, b, pairs)
    return Comparison(_delta(a, b), _changes(pairs), _findings(a, b), predicted, _achieved(b), pairs, note)
