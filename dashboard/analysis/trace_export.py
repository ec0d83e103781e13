"""A window of a trial as a Chrome / Perfetto JSON trace (the Trace Event Format's JSON
object form), for ui.perfetto.dev and chrome://tracing:

    {"traceEvents": [...], "displayTimeUnit": "ms"}

- framework events as complete events ("ph": "X", "ts" and "dur" in microseconds, "ts"
  the trial's own epoch microseconds), on one process per recording process (its OS pid
  where no other node has the same one) and, inside it, one thread per phase (GetNext,
  initialization, worker lifetime, fetches...): slices of one thread must nest, and events of
  different phases of a process overlap (a first batch spans its iterator's initialization);
- system metrics as counter events ("ph": "C"), one process per node named "... system
  metrics", one event per sample time and metric (its type and dimension) with one argument
  per series: "cpu CPUUtilization" {"cpu0": 12.5, "cpu1": 40.0}, "memory" {"MemoryUsedPercent":
  31.0} (Perfetto draws one counter track per argument, named "<event name> <argument>");
- "M" metadata events naming every process and thread.

The window is the dashboard's (dataloader.window): framework events overlapping it, kept
whole; system samples inside it. Pure: frames in, a dict out.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from .. import format as fmt
from . import dataloader

DISPLAY_TIME_UNIT = "ms"
# Framework columns carried into each slice's args where the event has them.
ARG_COLUMNS = ("process", "rank", "worker_id", "iterator_id", "step", "num_workers", "pin_memory", "persistent_workers",
               "prefetch_factor", "in_order", "cpu_us", "runq_us")
# Where a pid is missing or shared by two nodes, processes get ids from here on (above any
# Linux pid, whose maximum is 2**22).
SYNTHETIC_PID_BASE = 1 << 23
# Phases in the order their threads are listed.
_PHASE_ORDER = [fmt.PHASE_ITER, fmt.PHASE_INIT, fmt.PHASE_CREATED, fmt.PHASE_FIRST_BATCH, fmt.PHASE_EPOCH_END,
                fmt.PHASE_WORKER, fmt.PHASE_WORKER_FETCH]


def _plain(value):
    """A frame value as JSON: numpy scalars unwrapped, missing as None."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    if hasattr(value, "item"):
        value = value.item()
    return value


def _process_ids(keys: list[tuple[str, int | None]]) -> dict:
    """(node, pid) -> the trace's pid: the OS pid where it names one process of the trial."""
    owners: dict = {}
    for node, pid in keys:
        owners.setdefault(pid, set()).add(node)
    out, synthetic = {}, SYNTHETIC_PID_BASE
    for node, pid in keys:
        if pid is not None and pid >= 0 and len(owners[pid]) == 1:
            out[(node, pid)] = pid
        else:
            out[(node, pid)] = synthetic
            synthetic += 1
    return out


def _process_name(node: str, pid: int | None, events: pd.DataFrame) -> str:
    """'0-algo-1 (pid 812)' for a training process, '0-algo-1 DataLoader worker 1 (pid 815)' for
    one of its workers (the trial's process id names the training process a worker serves)."""
    owner = str(events["process"].iloc[0]) if "process" in events.columns else node
    kinds = set(events["kind"].astype(str))
    worker_ids = events.loc[events["kind"].isin([fmt.KIND_WORKER, fmt.KIND_FETCH]).to_numpy(), "worker_id"].dropna()
    where = "" if pid is None else f" (pid {pid})"
    if fmt.KIND_GETNEXT not in kinds and len(worker_ids):
        return f"{owner} DataLoader worker {int(worker_ids.iloc[0])}{where}"
    return f"{owner}{where}"


def _metadata(kind: str, pid: int, tid: int, name: str) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}


def _slices(framework: pd.DataFrame) -> tuple[list[dict], list[dict]]:
    """The framework events as "X" events, and the metadata naming their tracks."""
    if framework.empty:
        return [], []
    nodes = framework["node"].astype(str).to_numpy()
    pids = [None if p is pd.NA else int(p) for p in framework["pid"].astype("Int64").tolist()]
    keys = list(dict.fromkeys(zip(nodes, pids)))
    process_ids = _process_ids(keys)
    framework = framework.assign(_node=nodes, _pid=pids)
    phases = framework["phase"].astype(str)
    order = {phase: i for i, phase in enumerate(_PHASE_ORDER)}
    events, metadata = [], []
    tid = 0
    for (node, pid), process in framework.groupby(["_node", "_pid"], sort=False, dropna=False):
        pid = None if pid is None or (isinstance(pid, float) and math.isnan(pid)) else int(pid)
        trace_pid = process_ids[(node, pid)]
        metadata.append(_metadata("process_name", trace_pid, 0, _process_name(node, pid, process)))
        process_phases = sorted(set(phases[process.index]), key=lambda p: (order.get(p, len(order)), p))
        for sort_index, phase in enumerate(process_phases):
            tid += 1
            metadata.append(_metadata("thread_name", trace_pid, tid, phase))
            metadata.append({"ph": "M", "name": "thread_sort_index", "pid": trace_pid, "tid": tid,
                             "args": {"sort_index": sort_index}})
            rows = process[(phases[process.index] == phase).to_numpy()]
            columns = [c for c in ARG_COLUMNS if c in rows.columns and rows[c].notna().any()]
            for row in rows[["name", "start_us", "duration_us", *columns]].itertuples(index=False):
                args = {"node": node}
                if pid is not None:
                    args["pid"] = pid
                for column, value in zip(columns, row[3:]):
                    value = _plain(value)
                    if value is not None:
                        args[column] = value
                events.append({"ph": "X", "name": str(row[0]), "cat": phase, "ts": int(row[1]),
                               "dur": int(row[2]), "pid": trace_pid, "tid": tid, "args": args})
    return events, metadata


def counter_names(types: pd.Series, dimensions: pd.Series) -> np.ndarray:
    """A counter event's name per system sample: its type and, where it has one, dimension."""
    types, dimensions = types.astype(str).to_numpy(), dimensions.astype(str).to_numpy()
    return np.array([f"{t} {d}" if d else t for t, d in zip(types, dimensions)], dtype=object)


def _counters(system: pd.DataFrame, first_pid: int) -> tuple[list[dict], list[dict]]:
    """The system samples as "C" events: per node, timestamp and dimension, one event with a
    value per series."""
    if system.empty:
        return [], []
    events, metadata = [], []
    frame = pd.DataFrame({"node": system["node"].astype(str).to_numpy(),
                          "ts": system["timestamp_us"].to_numpy(dtype=np.int64),
                          "metric": counter_names(system["type"], system["dimension"]),
                          "name": system["name"].astype(str).to_numpy(),
                          "value": system["value"].to_numpy(dtype=np.float64)})
    frame = frame[np.isfinite(frame["value"].to_numpy())]
    for offset, (node, samples) in enumerate(frame.groupby("node", sort=True)):
        pid = first_pid + offset
        metadata.append(_metadata("process_name", pid, 0, f"{node} system metrics"))
        samples = samples.sort_values(["ts", "metric"], kind="stable")
        last = None
        # One pass over the samples (a loop over groups costs a frame per sample time).
        for ts, metric, name, value in zip(samples["ts"].tolist(), samples["metric"].tolist(),
                                           samples["name"].tolist(), samples["value"].tolist()):
            if (ts, metric) != last:
                last = (ts, metric)
                events.append({"ph": "C", "name": metric, "ts": ts, "pid": pid, "tid": 0, "args": {}})
            events[-1]["args"][name] = value
    return events, metadata


def chrome_trace(framework: pd.DataFrame, system: pd.DataFrame, start_us: int, end_us: int,
                 select_events: Sequence[str] = (".*",), select_dimensions: Sequence[str] = (".*",)) -> dict:
    """The window [start_us, end_us] of a trial's canonical frames as a Chrome/Perfetto JSON
    trace. select_events / select_dimensions filter as the dashboard's window does
    (ValueError for an invalid regular expression)."""
    window = dataloader.window(framework, system, start_us, end_us, select_events, select_dimensions)
    slices, slice_metadata = _slices(window.framework)
    used = [e["pid"] for e in slice_metadata if e["name"] == "process_name"]
    counters, counter_metadata = _counters(window.system, max([SYNTHETIC_PID_BASE - 1, *used]) + 1)
    timed = sorted(slices + counters, key=lambda e: e["ts"])
    return {"traceEvents": slice_metadata + counter_metadata + timed, "displayTimeUnit": DISPLAY_TIME_UNIT}
