"""Host contention: other processes held the cores that handing finished batches over
needs (`host_contention`). Reads the budget's `contention` part (budget._contention)."""
from __future__ import annotations

from ....display import duration_s
from .base import LoaderContext, Recommendation


def find(ctx: LoaderContext) -> list[Recommendation]:
    budget = ctx.budget
    part = budget.parts.get("contention", 0.0)
    if ctx.model is None or not ctx.worth(part):
        return []
    evidence = budget.evidence
    cores, cpu, others = ctx.process.cores, evidence.get("cpu_percent"), evidence.get("contention_other_cores")
    handover, uncontended = evidence.get("handover_median_s"), evidence.get("handover_uncontended_s")
    text = (f"{ctx.loader.label} on {ctx.process.label}: {duration_s(part)} of waiting were finished batches "
            f"waiting to be handed over while other processes held the host's cores ({cores} cores, "
            f"{cpu:.0f} % busy, {others:.1f} cores of it other processes'). A batch reached next() "
            f"{duration_s(handover)} after its worker had fetched it (median), against {duration_s(uncontended)} when "
            "it found a core at once: the worker's threads that pass it on and the training process queue for one. "
            "No DataLoader setting removes this (more workers queue for the same cores). Give the job cores of "
            "its own: a host or CPU set without the other load (`taskset`, a cgroup's cpuset), or lower the "
            "other processes' priority (`nice`). Without them this waiting goes, and the compute they slow "
            "speeds up too.")
    found = ctx.evidence(part_s=round(part, 6), cores=cores, cpu_percent=cpu, other_cores=others,
                         handover_median_s=handover, handover_uncontended_s=uncontended,
                         worker_gil_busy=evidence.get("worker_gil_busy"))
    return [ctx.recommend("host_contention", text, found, part, None)]
