"""Is the job input-bound, where did every second of waiting go, and what to change.

    assess(framework, system) -> Assessment
        .verdict                    the share of training time spent in GetNext (verdict)
        .nodes_verdict              the same per host, .processes_verdict per process (rank)
        .budget                     per training loader per process: the wait in parts (budget)
        .recommendations            one finding per part or stated cause (findings/), each
                                    with its change and its predicted effect; a straggler
                                    finding when one rank or host waits far more than the rest
        .what_if                    the predictions behind them
        .predict(change)            a what-if of your own, per training loader (what_if)

The modules answer one question each: `loaders` (what trained, for how long), `rounds` (the
worker count and each batch's place in its epoch, where a trace records neither), `pipeline`
(what the records imply about each batch; the replay), `budget`, `what_if`, `findings/`.
Pure functions of the frames: no I/O, no printing.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from ..dataloader import CallSegments
from . import findings as finding_modules
from . import loaders as loaders_module
from .loaders import ProcessTraining, process_order as _process_order
from .budget import PARTS, LoaderBudget, budget as loader_budget, unmodelled_budget
from .findings import MAX_LISTED, MIN_SHARE_OF_JOB, LoaderContext, Recommendation, rank
from .findings.straggler import stragglers
from .pipeline import PipelineModel, build
from .rounds import inferred_rounds
from .verdict import (CLASS_HIGHLY, CLASS_MODERATELY, CLASS_NOT, HIGHLY_INPUT_BOUND_PERCENT,
                      MODERATELY_INPUT_BOUND_PERCENT, Verdict, classify_input_percent, process_verdict,
                      trial_verdict)
from ...what_if_settings import KEYS as WHAT_IF_KEYS, parse as parse_what_if, validate as validate_what_if
from .what_if import WhatIf, predict


@dataclass
class Assessment:
    verdict: Verdict
    nodes_verdict: dict[str, Verdict]  # by host
    recommendations: list[Recommendation]
    budget: list[LoaderBudget] = field(default_factory=list)
    what_if: list[WhatIf] = field(default_factory=list)
    # Per budget, in its order: the compact pipeline model a later what-if replays (None:
    # the loader cannot be replayed).
    models: list[PipelineModel | None] = field(default_factory=list, repr=False)
    processes_verdict: dict[str, Verdict] = field(default_factory=dict)  # by process id

    def predict(self, change: dict) -> list[WhatIf]:
        """The what-if of `change` (e.g. {"num_workers": 8, "in_order": False}) for every
        training loader. ValueError names a bad key or value."""
        change = validate_what_if(change)
        return [predict(model, item, change) for model, item in zip(self.models, self.budget)]


def _merge_processes(found: list[Recommendation], labels: dict[str, str]) -> list[Recommendation]:
    """One finding per kind and loader: the process where it saves most, naming the other
    processes (ranks of one job) where the same loader has it. Two findings of one process are
    never one: of its loaders of one class (a training and a validation loader; loaders alike,
    Loader.alike), each is the same loader as the one at its place on the other processes."""
    by_key: dict[tuple, list[Recommendation]] = {}
    places: Counter = Counter()
    for item in found:
        alike = item.evidence.get("alike")
        key = (item.id, item.evidence.get("loader"), tuple(alike) if alike else None)
        in_process = (*key, item.evidence.get("process"))
        by_key.setdefault((*key, places[in_process]), []).append(item)
        places[in_process] += 1
    merged = []
    for items in by_key.values():
        items.sort(key=lambda r: -(r.saving_s or 0.0))
        head = items[0]
        ids = [r.evidence.get("process") for r in items]
        if len(set(ids)) > 1:
            others = [labels.get(i, i) for i in dict.fromkeys(ids) if i != head.evidence.get("process")]
            head = Recommendation(head.id, head.text + f" The same holds on {len(others)} other process(es): "
                                  + ", ".join(others[:MAX_LISTED]) + ".",
                                  {**head.evidence, "processes": sorted(set(ids))}, head.saving_s, head.change,
                                  head.predicted)
        merged.append(head)
    merged.sort(key=rank)
    return merged


@dataclass
class ProcessAssessment:
    """One process's part of an assessment: its budgets, findings and what-ifs, and the
    process without its per-batch frames (ProcessTraining.compact). A rank's work: computed
    where its events are (a worker that loaded only that rank), combined anywhere (combine)."""
    process: ProcessTraining
    found: list[Recommendation]
    budget: list[LoaderBudget]
    asked: list[WhatIf]
    models: list[PipelineModel | None]


def assess_process(process: ProcessTraining) -> ProcessAssessment:
    """The budgets and findings of one process's training loaders."""
    process.verdict = process_verdict(process)
    found: list[Recommendation] = []
    budgets: list[LoaderBudget] = []
    asked: list[WhatIf] = []
    models: list[PipelineModel | None] = []
    for loader in process.loaders:
        if loader.num_workers is None and loader.multi_process:
            inferred = inferred_rounds(loader)
            if inferred is not None:
                workers, placed = inferred
                loader = dataclasses.replace(loader, num_workers=workers, num_workers_inferred=True, calls=placed)
        replays = loader.num_workers is not None
        model = build(loader, process) if replays else None
        item = loader_budget(process, loader, model) if model is not None else unmodelled_budget(process, loader)
        budgets.append(item)

        def what_if(change, model=model, item=item):
            return predict(model, item, change)

        ctx = LoaderContext(process, loader, model, item, what_if)
        found += finding_modules.find(ctx)
        asked += ctx.asked
        models.append(model.compact() if model is not None else None)
    return ProcessAssessment(process.compact(), found, budgets, asked, models)


def assess_processes(framework: pd.DataFrame, system: pd.DataFrame, processes_per_host: dict[str, int] | None = None,
                     found: CallSegments | None = None) -> list[ProcessAssessment]:
    """Each training process's part of the assessment of these frames (all of a trial, or the
    rows of some of its processes, with the whole trial's processes_per_host)."""
    return [assess_process(p) for p in loaders_module.processes(framework, system, processes_per_host, found)]


def combine(parts: list[ProcessAssessment]) -> Assessment:
    """The assessment of a trial from its processes' parts: the verdicts over all of them,
    one finding per kind and loader, and the stragglers among them. The same as assess() on
    the whole trial, whichever worker computed each part."""
    parts = sorted(parts, key=lambda part: _process_order(part.process))
    processes = [part.process for part in parts]
    found = [item for part in parts for item in part.found]
    hosts = sorted({p.host for p in processes})
    merged = _merge_processes(found, {p.id: p.label for p in processes})
    merged = sorted(stragglers(processes) + merged, key=rank)
    return Assessment(trial_verdict(processes), {h: trial_verdict([p for p in processes if p.host == h]) for h in hosts},
                      merged, [b for part in parts for b in part.budget],
                      _unique([w for part in parts for w in part.asked]),
                      [m for part in parts for m in part.models], {p.id: p.verdict for p in processes})


def assess(framework: pd.DataFrame, system: pd.DataFrame, outlier_factor: float | None = None,
           found: CallSegments | None = None) -> Assessment:
    """The trial's verdict, each host's and process's, the wait budgets and the recommendations.

    `outlier_factor` is accepted for the callers' sake; the budget's own rules decide.
    `found`: the frame's call_segments (analysis.dataloader), when already computed."""
    return combine(assess_processes(framework, system, found=found))


def _unique(items: list[WhatIf]) -> list[WhatIf]:
    seen, out = set(), []
    for item in items:
        key = (item.process, item.loader, tuple(sorted(item.change.items())))
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


__all__ = ["Assessment", "ProcessAssessment", "assess_process", "assess_processes", "combine", "LoaderBudget", "PARTS", "Recommendation", "Verdict", "WhatIf", "assess",
           "classify_input_percent", "parse_what_if", "validate_what_if", "WHAT_IF_KEYS", "CLASS_HIGHLY",
           "CLASS_MODERATELY", "CLASS_NOT", "HIGHLY_INPUT_BOUND_PERCENT", "MODERATELY_INPUT_BOUND_PERCENT",
           "MIN_SHARE_OF_JOB"]
