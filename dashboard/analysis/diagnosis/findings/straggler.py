"""Stragglers: one rank, or one host, that waits for data far more than the rest of the job.

In a synchronous data-parallel job every rank waits for the slowest at each step's all-reduce,
so one rank's input pipeline costs every rank its extra wait. The finding compares each
process's share of training time spent in GetNext with the median share of the others; a
host whose ranks together wait far more than the other hosts' is named as the host (its
storage, CPU or network is the likely cause, and its CPU and I/O wait are given beside it)
when most of its ranks stand out on their own; they are then not named again one by one.

Needs two processes at least (a job not distributed has no stragglers). The saving is the
straggler's wait beyond what the others' median share would give it: what the job would gain
if it waited like the rest (its time, not a what-if of a DataLoader setting).
"""
from __future__ import annotations

import numpy as np

from ..loaders import ProcessTraining, mean_in_windows
from ....display import duration_s
from .base import MIN_SHARE_OF_JOB, Recommendation

# A straggler's wait share is at least this multiple of the others' median share...
STRAGGLER_FACTOR = 2.0
# ...and this many percentage points above it: 2 % against 1 % is no straggler.
STRAGGLER_MIN_POINTS = 10.0


def _share(wait_s: float, training_s: float) -> float | None:
    return 100.0 * wait_s / training_s if training_s > 0 else None


def _conditions(host_processes: list[ProcessTraining]) -> tuple[float | None, float | None]:
    """A host's mean CPU use and I/O wait over its processes' training windows (the processes
    of one host share its system series)."""
    windows = sorted(w for p in host_processes for w in p.windows)
    first = host_processes[0]
    return mean_in_windows(first.cpu, windows), mean_in_windows(first.iowait, windows)


def _median_of(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.median(known)) if known else None


def _percent(value: float | None) -> str:
    return "not recorded" if value is None else f"{value:.0f} %"


def _stands_out(share: float, others: list[float]) -> bool:
    median = float(np.median(others))
    return share >= STRAGGLER_FACTOR * median and share - median >= STRAGGLER_MIN_POINTS


def _worth(excess_s: float, processes: list[ProcessTraining]) -> bool:
    span_us = max(p.span_us for p in processes)
    return span_us > 0 and excess_s * 1e6 >= MIN_SHARE_OF_JOB * span_us


def stragglers(processes: list[ProcessTraining]) -> list[Recommendation]:
    """The straggler findings of a job: hosts first, then ranks on the other hosts."""
    timed = [p for p in processes if p.verdict is not None and p.verdict.training_s]
    if len(timed) < 2:
        return []
    found = []
    hosts = sorted({p.host for p in timed})
    by_host = {h: [p for p in timed if p.host == h] for h in hosts}
    host_share = {h: _share(sum(p.verdict.getnext_s for p in ps), sum(p.verdict.training_s for p in ps))
                  for h, ps in by_host.items()}
    shares = {p.id: _share(p.verdict.getnext_s, p.verdict.training_s) for p in timed}
    slow_hosts = set()
    if len(hosts) >= 2:
        for host in hosts:
            members = by_host[host]
            others = [host_share[h] for h in hosts if h != host]
            if len(members) < 2 or not _stands_out(host_share[host], others):
                continue  # a host of one process is that process: a rank finding says it
            elsewhere = [shares[p.id] for h in hosts if h != host for p in by_host[h]]
            if 2 * sum(_stands_out(shares[p.id], elsewhere) for p in members) < len(members):
                continue  # one slow rank lifts its host's share: that rank is the straggler
            median = float(np.median(others))
            excess = sum(p.verdict.getnext_s - median / 100 * p.verdict.training_s for p in members) / len(members)
            if not _worth(excess, members):
                continue
            slow_hosts.add(host)
            cpu, iowait = _conditions(members)
            rest = [_conditions(by_host[h]) for h in hosts if h != host]
            other_cpu, other_iowait = _median_of([c for c, _ in rest]), _median_of([i for _, i in rest])
            text = (f"Straggler host: the {len(members)} processes on {host} wait in GetNext "
                    f"{host_share[host]:.0f} % of their training, against a median of {median:.0f} % on the "
                    f"other {len(others)} host(s): {duration_s(excess)} more per rank. In a synchronous job "
                    f"every rank waits for them at each step. During training {host} ran at CPU "
                    f"{_percent(cpu)} with I/O wait {_percent(iowait)} (the other hosts' median: CPU "
                    f"{_percent(other_cpu)}, I/O wait {_percent(other_iowait)}): look at its storage, "
                    f"CPU and network before its DataLoader settings.")
            found.append(Recommendation("straggler_host", text, {
                "node": host, "processes": [p.id for p in members], "wait_percent": round(host_share[host], 2),
                "others_median_percent": round(median, 2), "excess_s": round(excess, 3),
                "cpu_percent": cpu, "iowait_percent": iowait, "others_cpu_percent": other_cpu,
                "others_iowait_percent": other_iowait}, round(excess, 3)))
    for process in timed:
        if process.host in slow_hosts:
            continue
        others = [shares[p.id] for p in timed if p is not process]
        if not _stands_out(shares[process.id], others):
            continue
        median = float(np.median(others))
        excess = process.verdict.getnext_s - median / 100 * process.verdict.training_s
        if not _worth(excess, [process]):
            continue
        cpu, iowait = _conditions(by_host[process.host])
        who = f"rank {process.rank}" if process.rank is not None else f"pid {process.pid}"
        text = (f"Straggler: {who} on {process.host} waits in GetNext {shares[process.id]:.0f} % of its "
                f"training, against a median of {median:.0f} % on the other {len(others)} process(es): "
                f"{duration_s(excess)} more. In a synchronous job every rank waits for it at each step. "
                f"Its host {process.host} ran at CPU {_percent(cpu)} with I/O wait {_percent(iowait)} during "
                f"its training; its own findings below say what its loader lacks.")
        found.append(Recommendation("straggler_rank", text, {
            "node": process.host, "process": process.id, "rank": process.rank, "pid": process.pid,
            "wait_percent": round(shares[process.id], 2), "others_median_percent": round(median, 2),
            "excess_s": round(excess, 3), "cpu_percent": cpu, "iowait_percent": iowait}, round(excess, 3)))
    return found
