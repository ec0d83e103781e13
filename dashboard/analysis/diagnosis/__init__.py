"""Is the job input-bound, where did every second of waiting go, and what to change.

    assess(framework, system) -> Assessment
        .verdict, .nodes_verdict    the share of training time spent in GetNext (verdict)
        .budget                     per training loader per node: the wait in parts (budget)
        .recommendations            one finding per part or stated cause (findings/), each
                                    with its change and its predicted effect
        .what_if                    the predictions behind them
        .predict(change)            a what-if of your own, per training loader (what_if)

The modules answer one question each: `loaders` (what trained, for how long), `pipeline`
(what the records imply about each batch; the replay), `budget`, `what_if`, `findings/`.
Pure functions of the frames: no I/O, no printing.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pandas as pd

from . import findings as finding_modules
from . import loaders as loaders_module
from .budget import PARTS, LoaderBudget, budget as loader_budget, unmodelled_budget
from .findings import MAX_LISTED, MIN_SHARE_OF_JOB, LoaderContext, Recommendation, rank
from .pipeline import PipelineModel, build, infer_workers
from .verdict import (CLASS_HIGHLY, CLASS_MODERATELY, CLASS_NOT, HIGHLY_INPUT_BOUND_PERCENT,
                      MODERATELY_INPUT_BOUND_PERCENT, Verdict, classify_input_percent, node_verdict,
                      trial_verdict)
from .what_if import KEYS as WHAT_IF_KEYS, WhatIf, parse as parse_what_if, predict, validate as validate_what_if


@dataclass
class Assessment:
    verdict: Verdict
    nodes_verdict: dict[str, Verdict]
    recommendations: list[Recommendation]
    budget: list[LoaderBudget] = field(default_factory=list)
    what_if: list[WhatIf] = field(default_factory=list)
    # Per budget, in its order: the compact pipeline model a later what-if replays (None:
    # the loader cannot be replayed).
    models: list[PipelineModel | None] = field(default_factory=list, repr=False)

    def predict(self, change: dict) -> list[WhatIf]:
        """The what-if of `change` (e.g. {"num_workers": 8, "in_order": False}) for every
        training loader. ValueError names a bad key or value."""
        change = validate_what_if(change)
        return [predict(model, item, change) for model, item in zip(self.models, self.budget)]


def _merge_nodes(found: list[Recommendation]) -> list[Recommendation]:
    """One finding per kind and loader: the node where it saves most, naming the other
    nodes (ranks of one job) where the same loader has it."""
    by_key: dict[tuple, list[Recommendation]] = {}
    for item in found:
        by_key.setdefault((item.id, item.evidence.get("loader")), []).append(item)
    merged = []
    for items in by_key.values():
        items.sort(key=lambda r: -(r.saving_s or 0.0))
        head = items[0]
        nodes = sorted({r.evidence.get("node") for r in items})
        if len(nodes) > 1:
            others = [n for n in nodes if n != head.evidence.get("node")]
            head = Recommendation(head.id, head.text + f" The same holds on {len(others)} other node(s): "
                                  + ", ".join(others[:MAX_LISTED]) + ".",
                                  {**head.evidence, "nodes": nodes}, head.saving_s, head.change, head.predicted)
        merged.append(head)
    merged.sort(key=rank)
    return merged


def assess(framework: pd.DataFrame, system: pd.DataFrame, outlier_factor: float | None = None) -> Assessment:
    """The trial's verdict, each node's, the wait budgets and the recommendations.

    `outlier_factor` is accepted for the callers' sake; the budget's own rules decide."""
    nodes = loaders_module.nodes(framework, system)
    found: list[Recommendation] = []
    budgets: list[LoaderBudget] = []
    asked: list[WhatIf] = []
    models: list[PipelineModel | None] = []
    for node in nodes:
        node.verdict = node_verdict(node)
        for loader in node.loaders:
            if loader.num_workers is None and loader.multi_process:
                inferred = infer_workers(loader)
                if inferred is not None:
                    loader = dataclasses.replace(loader, num_workers=inferred, num_workers_inferred=True)
            replays = loader.num_workers is not None
            model = build(loader, node) if replays else None
            item = loader_budget(node, loader, model) if model is not None else unmodelled_budget(node, loader)
            budgets.append(item)

            def what_if(change, model=model, item=item):
                return predict(model, item, change)

            ctx = LoaderContext(node, loader, model, item, what_if)
            found += finding_modules.find(ctx)
            asked += ctx.asked
            models.append(model.compact() if model is not None else None)
    return Assessment(trial_verdict(nodes), {n.node: n.verdict for n in nodes}, _merge_nodes(found), budgets,
                      _unique(asked), models)


def _unique(items: list[WhatIf]) -> list[WhatIf]:
    seen, out = set(), []
    for item in items:
        key = (item.node, item.loader, tuple(sorted(item.change.items())))
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def verdict(framework: pd.DataFrame) -> Verdict:
    """The trial's verdict alone."""
    return trial_verdict(loaders_module.nodes(framework, pd.DataFrame()))


__all__ = ["Assessment", "LoaderBudget", "PARTS", "Recommendation", "Verdict", "WhatIf", "assess",
           "classify_input_percent", "parse_what_if", "validate_what_if", "verdict", "WHAT_IF_KEYS", "CLASS_HIGHLY",
           "CLASS_MODERATELY", "CLASS_NOT", "HIGHLY_INPUT_BOUND_PERCENT", "MODERATELY_INPUT_BOUND_PERCENT",
           "MIN_SHARE_OF_JOB"]
