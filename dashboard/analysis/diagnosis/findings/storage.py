"""Storage: the CPUs wait on I/O during the GetNext stalls (`storage_bound`): a stated
cause inside the budget's `throughput` and `tail` parts, whose seconds bound it."""
from __future__ import annotations

import numpy as np

from ..loaders import in_windows, merge
from ....display import duration_s
from .base import MAX_LISTED, LoaderContext, Recommendation

# Mean I/O wait (over all cores) during GetNext stalls that marks the stalls as storage's:
# a training host otherwise reads near 0 %, and with several cores a tenth of all of them
# idle on storage means the workers are blocked on reads.
IOWAIT_HIGH_PERCENT = 10.0
# A stall: a GetNext this many times its loader's median.
STALL_FACTOR = 2.0


def find(ctx: LoaderContext) -> list[Recommendation]:
    process, loader, budget = ctx.process, ctx.loader, ctx.budget
    iowait = process.iowait
    at_stake = budget.parts["throughput"] + budget.parts["tail"] + budget.parts["main_process"]
    if iowait.empty or not ctx.worth(at_stake):
        return []
    calls = loader.calls
    waits = calls["duration_us"].to_numpy(dtype=np.float64)
    median = float(np.median(waits))
    stalls = np.flatnonzero(waits > STALL_FACTOR * max(median, 1.0))
    if not len(stalls):
        return []
    times = iowait.index.to_numpy()
    interval = float(np.median(np.diff(times))) if len(times) > 1 else 1_000_000.0
    half = interval / 2
    starts = calls["start_us"].to_numpy()[stalls]
    ends = calls["end_us"].to_numpy()[stalls]
    lo, hi = merge((starts - half).astype(np.int64), (ends + half).astype(np.int64))
    during = in_windows(times, list(zip(lo.tolist(), hi.tolist())))
    if not during.any():
        return []
    value = float(iowait[during].mean())
    if value < IOWAIT_HIGH_PERCENT:
        return []
    training = in_windows(times, process.windows) & ~during
    elsewhere = float(iowait[training].mean()) if training.any() else None
    excess_s = min(float(np.sum(waits[stalls] - median)) / 1e6, at_stake)
    longest = stalls[np.argsort(-waits[stalls], kind="stable")][:MAX_LISTED]
    text = (f"Storage-bound: during the {len(stalls)} GetNext stalls of {loader.label} on {process.label} (over "
            f"{STALL_FACTOR:g}x the median) the CPUs wait on I/O {value:.0f} % of the time"
            + (f" (against {elsewhere:.0f} % otherwise in training)" if elsewhere is not None else "")
            + f"; the stalls cost {duration_s(excess_s)}. Read faster: copy the data to local disk or NVMe "
            f"(or a faster file system), read larger sequential shards (WebDataset, TFRecord-like formats), "
            f"cache hot data in memory; I/O-bound loading also tolerates more workers than cores.")
    evidence = ctx.evidence(part_s=round(excess_s, 6), stalls=int(len(stalls)), iowait_percent=round(value, 1),
                            iowait_elsewhere_percent=None if elsewhere is None else round(elsewhere, 1),
                            iowait_threshold_percent=IOWAIT_HIGH_PERCENT, excess_s=round(excess_s, 6),
                            windows=[{"start_us": int(calls["start_us"].iat[r]), "end_us": int(calls["end_us"].iat[r]),
                                      "duration_s": round(waits[r] / 1e6, 6)} for r in longest])
    return [ctx.recommend("storage_bound", text, evidence, excess_s, None)]
