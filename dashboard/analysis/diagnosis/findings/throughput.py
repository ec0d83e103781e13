"""Throughput: the workers cannot keep up with the compute (`more_workers`), the cores
are the limit (`cpu_saturated`), or the loader has no workers at all (`use_workers`).
Reads the budget's `throughput` and `main_process` parts; the worker count is the
smallest the what-if finds to give nearly all of the best saving."""
from __future__ import annotations

from ....what_if_settings import MAX_WORKERS
from ..budget import cores_saturated
from ..verdict import MODERATELY_INPUT_BOUND_PERCENT
from ....display import duration_s
from .base import LoaderContext, Recommendation, predicted_text

# The worker count suggested is the smallest whose predicted saving is within this share
# of the best one tried: the last few workers of a search buy almost nothing.
NEAR_BEST = 0.9
# Worker counts tried: without a core count, at most this many.
MAX_TRIED_WORKERS = 64
# Workers that wait (latency-bound) are not limited by the cores: up to this many per core.
LATENCY_WORKERS_PER_CORE = 8
# More workers are worth suggesting when they remove at least this share of the throughput
# part: on saturated cores the model finds a few per cent (the last free core's worth),
# which is not what the user should change first.
MEANINGFUL_SHARE = 0.25


# A hand-over worth naming: well above the sub-millisecond cost of delivery itself.
HANDOFF_NAMED_S = 1e-3


def _own_handoff_s(evidence: dict) -> float | None:
    """Of a ready batch's hand-over, the part its worker's next sample holds up (the GIL)."""
    handoff, busy = evidence.get("handoff_s"), evidence.get("worker_gil_busy")
    if handoff is None:
        return None
    return handoff if busy is None else handoff * busy


def _handoff_text(evidence: dict) -> str:
    """The hand-over as measured, when the part the workers' own next samples hold up is worth naming."""
    own, handoff = _own_handoff_s(evidence), evidence.get("handoff_s")
    busy = evidence.get("worker_gil_busy")
    if not own or own < HANDOFF_NAMED_S:
        return ""
    share = f", and they were fetching {100 * busy:.0f} % of the time" if busy is not None else ""
    return (f" Batches the workers had finished still waited {duration_s(handoff)} each to be handed over: "
            f"a worker's queue thread needs the GIL and a core, which its next sample's work holds{share} "
            "(cheaper samples shorten it too).")


def _candidates(workers: int, cores: int | None, bound: str) -> list[int]:
    if bound == "latency" or not cores:
        cap = MAX_TRIED_WORKERS if not cores else min(MAX_TRIED_WORKERS, LATENCY_WORKERS_PER_CORE * cores)
    else:
        cap = max(2 * cores, workers + 1)  # the model stretches CPU work beyond the free cores
    base = max(workers, 1)
    tried = {workers + 1, workers + 2, workers + 4, 2 * base, 3 * base, 4 * base, 6 * base, 8 * base}
    return sorted(w for w in tried if workers < w <= cap)


def _search(ctx: LoaderContext, workers: int):
    """(best what-if, every what-if tried) over worker counts above today's."""
    tried = [ctx.what_if({"num_workers": w}) for w in _candidates(workers, ctx.process.cores, ctx.budget.bound)]
    tried = [t for t in tried if t.predicted is not None]
    if not tried:
        return None, []
    best = max(t.saving_s for t in tried)
    if best <= 0:
        return None, tried
    chosen = next(t for t in tried if t.saving_s >= NEAR_BEST * best)
    ctx.asked.append(chosen)  # the one the finding stands on, of the many tried
    return chosen, tried


def find(ctx: LoaderContext) -> list[Recommendation]:
    loader, budget = ctx.loader, ctx.budget
    if ctx.model is None:
        return []
    cores = ctx.process.cores
    cpu = budget.evidence.get("cpu_percent")
    host = (f"{cores} cores" + (f", {cpu:.0f} % busy" if cpu is not None else "")) if cores else "cores unknown"
    if loader.num_workers == 0:
        part = budget.parts["main_process"]
        if not ctx.worth(part):
            return []
        chosen, _ = _search(ctx, 0)
        # As for more workers: a change worth naming saves a share of the job, not only the
        # waiting it stands on (a clean Kineto run under two `yes`: 40 ms of waiting, 25 ms saved
        # of 1.7 s).
        if chosen is None or not ctx.worth(chosen.saving_s):
            return []
        suggested = chosen.change["num_workers"]
        text = (f"{loader.label} on {ctx.process.label} loads its batches in the training process: "
                f"{duration_s(part)} of waiting inside next(). Load in worker processes: "
                f"`num_workers={suggested}` ({host})." + predicted_text(chosen))
        evidence = ctx.evidence(part_s=round(part, 6), suggested_num_workers=suggested, cores=cores,
                                cpu_percent=cpu)
        return [ctx.recommend("use_workers", text, evidence, part, chosen)]

    part = budget.parts["throughput"]
    # Every batch pays the delivery cost, ready or not: more workers do not remove it. Of
    # it, the hand-over of finished batches by workers busy computing their next sample is
    # the workers' CPU work (pipeline.build), which cheaper samples do remove: on computing
    # workers only delivery itself is set aside. (Counting the hand-over too left the cpu
    # scenario's planted fault below the bar in one CI run: its ready batches waited 6-8 ms.)
    # The hand-over is the workers' own only as often as they are busy: a batch finished by an
    # idle worker waits for a core the host's other processes hold (the clean scenario with
    # four `yes` running: ready batches waited 3-4 ms each on workers busy 7 % of the time,
    # which cheaper samples cannot shorten).
    # The hand-over that other processes' hold on the cores adds is the contention part's,
    # already out of this one (budget._contention).
    per_batch = budget.evidence.get("delivery_s") or 0.0
    own_handoff = _own_handoff_s(budget.evidence)
    if budget.bound == "cpu":
        per_batch -= own_handoff or 0.0
    delivery = max(per_batch * budget.evidence.get("batches", 0) - budget.parts.get("contention", 0.0), 0.0)
    # Worth a change of worker count when it alone makes the loader moderately input-bound.
    if not ctx.worth(part - delivery) or part - delivery < MODERATELY_INPUT_BOUND_PERCENT / 100 * budget.training_s:
        return []
    if budget.slow_worker is not None and budget.parts["imbalance"] > part:
        # One slow worker explains more of the wait than too few workers do: it is the cause to
        # fix first (findings.MODULES), and more workers would mostly dilute it. Their predicted
        # saving, which ranks first, is then the slow worker's (a Kineto run with worker 1 slow,
        # under three `yes`: 55 ms of throughput beside 430 ms of imbalance; "raise num_workers
        # to 6" claimed 0.48 s and the slow-worker finding, whose saving it overlapped, was dropped).
        return []
    workers = loader.num_workers
    chosen, tried = _search(ctx, workers)
    evidence = ctx.evidence(part_s=round(part, 6), bound=budget.bound,
                            bound_estimated=budget.evidence.get("bound_estimated"), cores=cores,
                            cpu_percent=cpu, stretch=budget.evidence.get("stretch"),
                            cores_for_workers=budget.evidence.get("cores_for_workers"),
                            service_median_s=budget.evidence.get("service_median_s"),
                            median_compute_s=budget.evidence.get("median_compute_s"),
                            handoff_s=budget.evidence.get("handoff_s"), own_handoff_s=own_handoff,
                            worker_busy=budget.evidence.get("worker_busy"),
                            worker_gil_busy=budget.evidence.get("worker_gil_busy"),
                            tried={str(t.change["num_workers"]): t.saving_s for t in tried})
    why = ("the workers wait on storage, the network or locks (their fetches use little CPU)"
           if budget.bound == "latency" else "the workers compute (their fetches use the CPU)"
           if budget.bound == "cpu" else "what limits the workers is not recorded")
    if budget.evidence.get("bound_estimated") and budget.bound != "unknown":
        why += ", estimated from the host's CPU use"
    # Computing workers on a saturated host: whatever more workers gain, they take from the
    # main process and the host's other processes; the fix is cheaper samples.
    saturated = budget.bound == "cpu" and cores_saturated(cpu, cores)
    if saturated or chosen is None or not ctx.worth(chosen.saving_s) or chosen.saving_s < MEANINGFUL_SHARE * part:
        if budget.bound == "cpu":
            more = min(2 * workers, MAX_WORKERS)  # (what a what-if may ask: see tail.py)
            doubled = ctx.predict({"num_workers": more}) if more > workers else None
            text = (f"{loader.label} on {ctx.process.label}: the workers cannot keep up "
                    f"({duration_s(part)} of steady waiting) and the CPUs are the limit ({host}; {why}): "
                    f"more workers will not help, or only by taking cores from the other processes on it."
                    + _handoff_text(budget.evidence)
                    + predicted_text(doubled).replace("Predicted:", f"Predicted with num_workers={more}:")
                    + " Make per-sample work cheaper (decode smaller images, lighter augmentation, a faster "
                    "decoder), cache decoded or preprocessed samples, or move decoding and augmentation to "
                    "the GPU (e.g. NVIDIA DALI, `torchvision.io.decode_jpeg(device='cuda')`).")
            evidence["more_workers_predicted"] = None if doubled is None else doubled.predicted
            return [ctx.recommend("cpu_saturated", text, evidence, part, None)]
        return []
    suggested = chosen.change["num_workers"]
    evidence["suggested_num_workers"] = suggested
    beyond = f", more than the {cores} cores: waiting workers need no core" if cores and suggested > cores \
        and budget.bound == "latency" else ""
    text = (f"{loader.label} on {ctx.process.label}: the workers cannot keep up with the compute "
            f"({duration_s(part)} of steady waiting; {why}; {host}). Raise `num_workers` from {workers} to "
            f"{suggested}{beyond}." + predicted_text(chosen))
    return [ctx.recommend("more_workers", text, evidence, part, chosen)]
