"""Start-up: workers re-created every epoch (`persistent_workers`), or one costly start
(`startup`). Reads the budget's `startup` part."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ....display import duration_s
from .base import MAX_LISTED, LoaderContext, Recommendation, predicted_text

# A first start is a finding of its own when the first batches cost this share of the
# job: starting workers always costs something (tens of ms to fork, seconds to spawn),
# and under 5 % that is the normal price of having workers.
STARTUP_MIN_SHARE = 0.05


def _starts(calls: pd.DataFrame, inits: pd.DataFrame) -> list[dict]:
    firsts = calls.loc[calls["index"] == 0, ["start_us", "end_us"]].sort_values("start_us", kind="stable")
    firsts = firsts.head(MAX_LISTED)
    if inits.empty:
        began = firsts["start_us"].to_numpy()
    else:
        at = np.searchsorted(inits["start_us"].to_numpy(), firsts["start_us"].to_numpy(), side="right") - 1
        began = np.where(at >= 0, inits["start_us"].to_numpy()[np.clip(at, 0, None)], firsts["start_us"].to_numpy())
    return [{"start_us": int(b), "end_us": int(e), "startup_s": round((e - b) / 1e6, 6)}
            for b, e in zip(began, firsts["end_us"].to_numpy())]


def find(ctx: LoaderContext) -> list[Recommendation]:
    loader, budget = ctx.loader, ctx.budget
    startup = budget.parts["startup"]
    if not loader.multi_process or not ctx.worth(startup):
        return []
    model = ctx.model
    inits = ctx.process.inits
    mine = inits[((inits["pid"] == loader.pid) & (inits["cls"] == loader.cls)
                  & inits["start_us"].isin(loader.init_starts_us)).to_numpy()]
    init_s = float(mine["duration_us"].median()) / 1e6 if len(mine) else None
    recreated = loader.persistent is False and loader.segments >= 2
    calls = loader.calls
    first_batch_s = float(calls.loc[calls["index"] == 0, "duration_us"].median()) / 1e6
    starts = int(model.recreated.sum()) if model is not None else loader.segments
    evidence = ctx.evidence(part_s=round(startup, 6), iterators=loader.segments, starts_total=starts,
                            persistent_workers=loader.persistent,
                            persistent_recorded=loader.persistent_recorded,
                            startup_s=round(startup / max(starts, 1), 6), first_batch_s=round(first_batch_s, 6),
                            init_median_s=None if init_s is None else round(init_s, 6),
                            windows=[{"start_us": s, "end_us": e} for s, e in budget.windows.get("startup", [])])
    if recreated:
        # Each start, from its initialization to the end of its first batch: what it cost.
        evidence["starts"] = _starts(calls, mine)
        evidence["startup_compute_s"] = round(model.startup_compute_us / 1e6, 6) if model is not None else None
        del evidence["windows"]
        result = ctx.predict({"persistent_workers": True})
        if result.predicted is not None and not ctx.worth(result.saving_s):
            return []  # the waits are the pipeline filling each epoch, which persistence keeps
        text = (f"Workers are re-created every epoch: {loader.label} on {ctx.process.label} started new workers "
                f"{starts} times, and the first batches of each start waited {duration_s(startup / starts)} "
                f"beyond the steady wait ({duration_s(startup)} in all)"
                + (f"; each iter() took {duration_s(init_s)} more" if init_s else "")
                + (f"; and the training loop's compute ran {duration_s(model.startup_compute_us / 1e6)} slower "
                   f"after each start (forking workers slows the parent)"
                   if model is not None and ctx.worth(model.startup_compute_us / 1e6 * (starts - 1)) else "")
                + ". Set `persistent_workers=True` on this DataLoader so its workers start once."
                + predicted_text(result))
        return [ctx.recommend("persistent_workers", text, evidence, startup, result)]
    if not ctx.worth(startup, STARTUP_MIN_SHARE):
        return []
    steady = np.median(budget.evidence.get("steady_wait_s") or [0.0])
    text = (f"The first batches of {loader.label} on {ctx.process.label} wait {duration_s(startup)} beyond the "
            f"steady wait ({duration_s(float(steady))} a batch) over {starts} start(s): a start-up cost. "
            f"Workers started with 'spawn' (the default on macOS and Windows, and needed with CUDA in the "
            f"parent) re-import the main module and unpickle the dataset: use "
            f"`multiprocessing_context='forkserver'` or 'fork' where safe, keep the Dataset's `__init__` and "
            f"`worker_init_fn` light (open files and connections lazily, in the worker), and keep the dataset "
            f"object small to pickle.")
    return [ctx.recommend("startup", text, evidence, startup, None)]
