"""Tail: single slow samples or batches beyond the loader's steady service time
(`slow_samples`). Reads the budget's `tail` part; the change is the one of a few the
what-if finds best at hiding them (deeper prefetch, out-of-order delivery, more workers),
if any hides enough to be worth it."""
from __future__ import annotations

import numpy as np

from ....what_if_settings import MAX_PREFETCH, MAX_WORKERS
from ..budget import TAIL_FACTOR
from ....display import duration_s
from .base import LoaderContext, Recommendation, batch_list, predicted_text


def find(ctx: LoaderContext) -> list[Recommendation]:
    budget, loader, model = ctx.budget, ctx.loader, ctx.model
    part = budget.parts["tail"]
    if model is None or not loader.multi_process or not ctx.worth(part):
        return []
    workers, prefetch = loader.num_workers, loader.prefetch_factor
    # More than today's, within what a what-if may ask (a loader with prefetch_factor=33, which
    # torch accepts, made the analysis fail on its 66).
    candidates = ([{"prefetch_factor": p} for p in sorted({min(2 * prefetch, MAX_PREFETCH),
                                                          min(4 * prefetch, MAX_PREFETCH)}) if p > prefetch]
                  + [{"num_workers": w} for w in (min(2 * workers, MAX_WORKERS),) if w > workers])
    if loader.in_order:
        candidates.append({"in_order": False})
    tried = [ctx.what_if(c) for c in candidates]
    tried = [t for t in tried if t.predicted is not None]
    best = max(tried, key=lambda t: t.saving_s, default=None)
    if best is not None and ctx.worth(best.saving_s):
        ctx.asked.append(best)
        change = ", ".join(f"`{k}={v}`" for k, v in best.change.items())
        fix = f" {change} hides most of them: workers fetch further ahead of the slow ones." + predicted_text(best)
    else:
        best = None
        fix = " No DataLoader setting hides them (the model tried deeper prefetch, more workers, out-of-order)."
    rows = budget.tail_rows  # the budget's own tail batches
    rows = rows[np.argsort(-model.wait_us[rows], kind="stable")]
    text = (f"Slow samples: {len(rows)} batches of {loader.label} on {ctx.process.label} wait far beyond their "
            f"worker's steady wait (over {TAIL_FACTOR:g}x it), {duration_s(part)} in all; the longest "
            f"{duration_s(float(model.wait_us[rows[0]]) / 1e6) if len(rows) else '-'}. Find those samples "
            f"(the batches and their workers are listed): a slow read, an oversized item, a retry." + fix)
    evidence = ctx.evidence(part_s=round(part, 6), tail_batches=int(len(rows)),
                            tried={", ".join(f"{k}={v}" for k, v in t.change.items()): t.saving_s for t in tried},
                            batches=batch_list(loader.calls, rows))
    return [ctx.recommend("slow_samples", text, evidence, part, best)]
