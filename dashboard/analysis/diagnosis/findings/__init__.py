"""The findings: one module per cause, each reading one part of the wait budget."""
from __future__ import annotations

from . import contention, imbalance, pin_memory, startup, storage, tail, throughput
from .base import MAX_LISTED, MIN_SHARE_OF_JOB, LoaderContext, Recommendation

# Each module's findings, in the order their causes are fixed first: a slow worker or
# storage explains the waits before more workers would only dilute them.
MODULES = (throughput, contention, imbalance, startup, tail, storage, pin_memory)
ORDER = ("straggler_host", "straggler_rank", "use_workers", "cpu_saturated", "host_contention", "more_workers", "persistent_workers", "slow_worker", "slow_samples",
         "storage_bound", "startup", "pin_memory")


def rank(item: Recommendation) -> tuple:
    """Findings' order: the largest saving first, then those without one, by cause."""
    return item.saving_s is None, -(item.saving_s or 0.0), ORDER.index(item.id)


def find(ctx: LoaderContext) -> list[Recommendation]:
    """The loader's findings, their savings capped so that together they never exceed its
    wait: a change's prediction alone can count seconds another change also removes. A
    finding whose saving the ones before it claim is left out, unless its cause's own part
    of the wait is worth naming: then it stays, its saving capped (a change that dilutes a
    cause can predict more than removing the cause, and the cause must still be named)."""
    found = [item for module in MODULES for item in module.find(ctx)]
    found = _storage_explains_tail(found)
    found.sort(key=rank)
    left = ctx.budget.wait_s
    capped = []
    for item in found:
        if item.saving_s is not None and item.id != "pin_memory":
            saving = round(min(item.saving_s, max(left, 0.0)), 3)
            left -= saving
            if saving != item.saving_s:
                if not ctx.worth(saving) and not ctx.worth(item.evidence.get("part_s")):
                    continue  # what it would save, the findings before it already claim
                item = Recommendation(item.id, item.text, {**item.evidence, "uncapped_saving_s": item.saving_s},
                                      saving, item.change, item.predicted)
        capped.append(item)
    return capped


def _storage_explains_tail(found: list[Recommendation]) -> list[Recommendation]:
    """When the stalls are storage's, the slow-samples finding is that cause: one finding,
    with the tail's change and prediction."""
    by_id = {item.id: item for item in found}
    storage_item, tail_item = by_id.get("storage_bound"), by_id.get("slow_samples")
    if storage_item is None or tail_item is None:
        return found
    merged = Recommendation(storage_item.id, storage_item.text + (
        f" Meanwhile {', '.join(f'`{k}={v}`' for k, v in tail_item.change.items())} hides part of them."
        if tail_item.change else ""), {**storage_item.evidence, "tail": tail_item.evidence},
        tail_item.saving_s if tail_item.change else storage_item.saving_s, tail_item.change, tail_item.predicted)
    return [merged if item is storage_item else item for item in found if item is not tail_item]


__all__ = ["LoaderContext", "Recommendation", "find", "rank", "ORDER", "MAX_LISTED", "MIN_SHARE_OF_JOB"]
