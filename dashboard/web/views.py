"""What the callbacks send: the panels of a loaded trial and the window payload.

Plain functions of a loaded trial, so the benchmark can time them without a browser:

    view = trial_view(dashboard.load_trial(path))               # once per load
    payload = window_payload(view, start_us, end_us)          # every brush on the overview
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from .. import format as fmt
from ..analysis import dataloader, per_batch, ranks
from ..analysis.trace_export import chrome_trace
from ..analysis.dataloader import DEFAULT_OUTLIER_FACTOR, DataLoaderAnalysis
from ..analysis.diagnosis import PARTS, WHAT_IF_KEYS, Assessment, LoaderBudget, Recommendation, WhatIf
from ..analysis.diagnosis.findings.base import predicted_text
from ..api import TrialAnalysis
from ..report import NOT_RECORDED_WORDS, PART_WORDS, no_findings_reason, not_recorded_anywhere
from ..report import to_dict
from ..report import saving_text  # noqa: F401  (the page's words for a saving are the report's)
from ..display import MAIN_PROCESS, duration_s, duration_us, iso_utc, short_name
from ..display import prediction_text as _prediction_text
from ..trial.errors import TrialError, TrialTooLargeError
from ..trial.load import Trial
from ..trial.store import redact
from . import figures

# Clicking an outlier shows it with this much of its own length on each side (at least
# MIN_MARGIN_US), so what happened just before and after is in view.
OUTLIER_MARGIN = 0.5
MIN_MARGIN_US = 1_000
MAX_TABLE_ROWS = 500  # longest outliers listed; the count says how many there are
MAX_SAMPLE_GAP_US = 60_000_000  # the slowest system sampling there is
MAX_BATCH_BARS = 300  # wait against compute: more batches in a window are drawn in buckets


@dataclass
class TrialView:
    """A loaded trial (or one node of it) with what every figure reuses."""
    trial: Trial
    analysis: TrialAnalysis
    overview: figures.OverviewSeries
    key: str = ""
    sample_gap_us: int = 0  # the usual time between two system samples
    precomputed_assessment: Assessment | None = None  # from the trial cache, when it has one
    # Each loader's batches (per_batch.loader_batches), computed on its first window.
    loader_batches: dict = field(default_factory=dict, repr=False)

    @property
    def span(self) -> tuple[int, int]:
        return self.overview.start_us, self.overview.end_us

    @property
    def assessment(self) -> Assessment:
        """The verdict and recommendations of this trial (or node)."""
        return self.precomputed_assessment or self.analysis.assessment


def trial_view(trial: Trial, node: str | None = None, analysis: DataLoaderAnalysis | None = None,
               key: str = "", factor: float = DEFAULT_OUTLIER_FACTOR,
               assessment: Assessment | None = None) -> TrialView:
    part = trial.for_node(node)
    analysis = analysis or dataloader.analyze(part.framework, factor)
    start, end = trial.start_us, trial.end_us  # the whole job's span, whatever the node
    if start is None:
        start = end = 0
    return TrialView(part, TrialAnalysis(trial=part, dataloader=analysis, node=node),
                     figures.overview_series(part.system, analysis.getnext.events, start, end), key,
                     sample_gap_us=_sample_gap_us(part.system), precomputed_assessment=assessment)


def _sample_gap_us(system: pd.DataFrame) -> int:
    """The usual time between two samples of a node (the longest of the nodes' medians)."""
    gaps = [0.0]
    for _, stamps in system.groupby("node", observed=True)["timestamp_us"]:
        unique = np.unique(stamps.to_numpy())
        if len(unique) > 1:
            gaps.append(float(np.median(np.diff(unique))))
    return int(min(max(gaps), MAX_SAMPLE_GAP_US))


# --- time ranges ------------------------------------------------------------------------------

# A time text is an ISO moment or a number of epoch microseconds, well under this: a longer one
# (a drag's or the URL's, from the client) is no time, and not parsed (pd.Timestamp's cost grows
# with the square of the text's length: 3 MB held a server thread for 112 s).
MAX_TIME_TEXT_CHARS = 64
# The moments pandas can hold, in epoch microseconds (years 1677 to 2262): a time outside is
# no time (orjson cannot even encode an int of 2**64 or more, the page's answer failed).
MAX_EPOCH_US = pd.Timestamp.max.value // 1000


def _epoch_us(us: int) -> int | None:
    return us if -MAX_EPOCH_US <= us <= MAX_EPOCH_US else None


def parse_time_us(value) -> int | None:
    """Epoch microseconds from a plotly date string ('2026-11-29 21:10:08.4312', taken as UTC),
    an ISO-8601 string, or a number (epoch us). None when it is none of them, or a moment
    outside pandas' range."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _epoch_us(int(value)) if math.isfinite(value) else None
    text = value if isinstance(value, str) else str(value)
    if len(text) > MAX_TIME_TEXT_CHARS:
        return None
    text = text.strip()
    digits = text.removeprefix("-")
    if digits.isascii() and digits.isdigit():  # ASCII only: str.isdigit() takes "²", int() does not
        return _epoch_us(int(text))
    try:
        stamp = pd.Timestamp(text)
        if stamp is pd.NaT:
            return None
        if stamp.tzinfo is None:
            stamp = stamp.tz_localize("UTC")
        return _epoch_us(int(stamp.value // 1000))  # .value: OverflowError past pandas' years
    except (ValueError, TypeError, OverflowError):
        return None


def time_window(start, end) -> list[int] | None:
    """[start_us, end_us] from two times (parse_time_us), or None unless both are times and the
    end is later: the URL's window, and the one a load request brings back."""
    start, end = parse_time_us(start), parse_time_us(end)
    return [start, end] if start is not None and end is not None and end > start else None


def range_from_ms(value) -> int | None:
    """A plotly date-axis range end: a date string, or a number of epoch milliseconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _epoch_us(int(round(value * 1000))) if math.isfinite(value) else None
    return parse_time_us(value)


def relayout_range(relayout: dict | None) -> tuple[int, int] | str | None:
    """The x range a drag chose: (start_us, end_us), "full" for autorange, or None.

    A zoom drag gives `xaxis.range[0]`/`[1]`, the range slider `xaxis.range`, a box select
    `selections`; on a figure with several matched x axes the key may be `xaxis3...`.
    """
    if not relayout:
        return None
    for key, value in relayout.items():
        base, _, rest = key.partition(".")
        if not base.startswith("xaxis"):
            continue
        if rest == "range" and isinstance(value, (list, tuple)) and len(value) == 2:
            lo, hi = range_from_ms(value[0]), range_from_ms(value[1])
        elif rest == "range[0]":
            lo, hi = range_from_ms(value), range_from_ms(relayout.get(f"{base}.range[1]"))
        elif rest == "autorange" and value:
            return "full"
        else:
            continue
        if lo is not None and hi is not None:
            return (min(lo, hi), max(lo, hi))
    selections = relayout.get("selections")
    if isinstance(selections, list) and selections:
        last = selections[-1]
        lo, hi = range_from_ms(last.get("x0")), range_from_ms(last.get("x1"))
        if lo is not None and hi is not None:
            return (min(lo, hi), max(lo, hi))
    return None


def selection_cleared(triggered: list, graph_id: str, selected_data) -> bool:
    """Whether this call is a graph's box selection being cleared (a double-click in select
    mode), and not a new selection (which comes with a relayout naming its range)."""
    props = {t.get("prop_id") for t in triggered or [] if isinstance(t, dict)}
    return f"{graph_id}.selectedData" in props and f"{graph_id}.relayoutData" not in props and not selected_data


# The narrowest window a drag sets: plotly sends a date axis's range to 0.1 ms, so a drag
# narrower than that comes back as an empty range, which plotly itself widens to 2 s.
MIN_DRAG_WINDOW_US = 100


def drag_window(found: tuple[int, int]) -> tuple[tuple[int, int], bool]:
    """The window a drag's range sets, and whether it was widened: one narrower than
    MIN_DRAG_WINDOW_US becomes the MIN_DRAG_WINDOW_US around its middle."""
    lo, hi = found
    if hi - lo >= MIN_DRAG_WINDOW_US:
        return found, False
    middle = (lo + hi) // 2
    return (middle - MIN_DRAG_WINDOW_US // 2, middle + MIN_DRAG_WINDOW_US // 2), True


def outlier_window(start_us: int, end_us: int) -> tuple[int, int]:
    margin = max(int((end_us - start_us) * OUTLIER_MARGIN), MIN_MARGIN_US)
    return start_us - margin, end_us + margin


def window_text(start_us: int, end_us: int) -> str:
    return f"{iso_utc(start_us)} – {iso_utc(end_us)}"


# --- the window -------------------------------------------------------------------------------

def _patterns(text: str | None) -> list[str]:
    return [text] if text and text.strip() else [".*"]


def first_window(store: dict, window: dict, select_events: str | None, select_dimensions: str | None,
                 loader: str | None) -> bool:
    """Whether a window is the one a page opens a trial with: the whole job, every event and
    metric, the loader that waits most, nothing selected."""
    return ((window.get("start_us"), window.get("end_us")) == (store.get("start_us"), store.get("end_us"))
            and _patterns(select_events) == _patterns(select_dimensions) == [".*"]
            and not loader and not window.get("selected"))


def check_patterns(select_events: str | None, select_dimensions: str | None) -> None:
    """ValueError naming the first of the two filters that is not a valid regular expression."""
    dataloader.validate_patterns(_patterns(select_events))
    dataloader.validate_patterns(_patterns(select_dimensions))


def stall_threshold_us(view: TrialView) -> float | None:
    """GetNexts longer than this are stalls: the outlier threshold (factor x the median)."""
    result = view.analysis.dataloader
    median = result.getnext.median_us
    return None if not median else float(median) * result.outlier_factor


def selected_loader(view: TrialView, loader: str | None) -> dict | None:
    """The loader whose batches the window draws: the one `loader` (the what-if's selector
    value, loader_key()) names, else the training loader that waits most; None without one."""
    return loader_row(budget_rows(view), loader)


def loader_row(rows: list[dict], loader: str | None) -> dict | None:
    """selected_loader among budget_rows()."""
    if not rows:
        return None
    chosen = [row for row in rows if row["key"] == loader]
    return chosen[0] if chosen else max(rows, key=lambda row: row["wait_s"])


def loader_batches_of(view: TrialView, row: dict) -> per_batch.LoaderBatches:
    """Every batch of the loader of a budget row (selected_loader), computed once per view."""
    key = row["key"]
    if key not in view.loader_batches:
        view.loader_batches[key] = per_batch.loader_batches(view.trial.framework, iterator=row["iterator"],
                                                            process=row["process"], node=None if row["process"]
                                                            else row["node"])
    return view.loader_batches[key]


@dataclass
class WindowBase:
    """What every window of a trial (or node) is drawn with beside its own events: a large
    trial's drags read only the window's files (dashboard/trial/window_files.py) and take this
    from the page's parts, not from the whole trial."""
    key: str
    overview: figures.OverviewSeries
    sample_gap_us: int
    stall_us: float | None
    budget_rows: list[dict]


def window_base(view: TrialView) -> WindowBase:
    return WindowBase(view.key, view.overview, view.sample_gap_us, stall_threshold_us(view), budget_rows(view))


def batch_bars(view: TrialView, loader: str | None, start_us: int, end_us: int) -> figures.BatchBars | None:
    """The selected loader's wait against compute inside the window, as the figure draws it."""
    return _batch_bars(budget_rows(view), lambda row: loader_batches_of(view, row), loader, start_us, end_us)


def _batch_bars(rows: list[dict], batches_of, loader: str | None, start_us: int,
                end_us: int) -> figures.BatchBars | None:
    row = loader_row(rows, loader)
    if row is None:
        return None
    shown = per_batch.buckets(batches_of(row), start_us, end_us, MAX_BATCH_BARS)
    return figures.BatchBars(row["label"], shown.start_us, shown.end_us, shown.wait_us, shown.compute_us,
                             shown.batches, shown.first)


def window_payload(view: TrialView, start_us: int, end_us: int, select_events: str | None = ".*",
                   select_dimensions: str | None = ".*", loader: str | None = None,
                   selected: dict | None = None) -> dict:
    """Everything a new window sends: the detail timeline (with the `loader`'s batches and the
    `selected` outlier, {start_us, end_us, label}, marked), the overview with the window on it,
    and the range text. ValueError (naming the pattern) for an invalid regular expression."""
    return window_payload_of(window_base(view), view.trial, lambda row: loader_batches_of(view, row), start_us,
                             end_us, select_events, select_dimensions, loader, selected)


def window_payload_of(base: WindowBase, trial: Trial, batches_of, start_us: int, end_us: int,
                      select_events: str | None = ".*", select_dimensions: str | None = ".*",
                      loader: str | None = None, selected: dict | None = None) -> dict:
    """window_payload of a trial's window base and its events (the whole trial's, or those of
    the files the window reaches: the same payload); batches_of(budget row): that loader's
    batches (per_batch.loader_batches)."""
    start_us, end_us = int(start_us), int(end_us)
    # One sampling interval more on each side: metric lines then cross the window's edges.
    pad = base.sample_gap_us
    window = dataloader.window(trial.framework, trial.system, start_us - pad, end_us + pad,
                               _patterns(select_events), _patterns(select_dimensions))
    revision = base.key or "trial"
    window_revision = f"{revision}:{start_us}:{end_us}"
    stall_us = base.stall_us
    # The batches go with the GetNexts they come from: an events filter that hides those hides them.
    shows_getnext = bool(len(window.framework)) and bool((window.framework["kind"] == fmt.KIND_GETNEXT).any())
    bars = _batch_bars(base.budget_rows, batches_of, loader, start_us, end_us) if shows_getnext else None
    return {
        "window_figure": figures.window_figure_spec(window, uirevision=revision, x_range=(start_us, end_us),
                                                    range_revision=window_revision, stall_us=stall_us,
                                                    selected=selected, batches=bars),
        "overview_figure": figures.overview_figure_spec(base.overview, (start_us, end_us), uirevision=revision,
                                                        range_revision=window_revision, stall_us=stall_us,
                                                        selected=selected),
        "window_range": window_text(start_us, end_us),
    }


# --- the panels -------------------------------------------------------------------------------

def _int_text(value) -> str:
    return "-" if value is None or value is pd.NA else str(int(value))


def outlier_rows(frame: pd.DataFrame, value_column: str, unrecorded_hosts=()) -> list[dict]:
    """Table rows for an outliers frame (longest first); raw times ride along for clicks.

    unrecorded_hosts: hosts whose profiler does not record worker ids (Kineto traces): their
    unknown worker id reads "not recorded", not a blank or a number. A batch loaded in the training
    process (worker id -1, num_workers=0) reads "main process"."""
    rows = []
    unrecorded = set(unrecorded_hosts)
    for i, row in enumerate(frame.head(MAX_TABLE_ROWS).to_dict("records")):
        start, end = iso_utc(int(row["start_us"])), iso_utc(int(row["end_us"]))
        out = {"id": i, "start_us": int(row["start_us"]), "end_us": int(row["end_us"]),
               "start": start, "end": end, "span": f"{start} – {end}"}
        value = row[value_column]
        out[value_column] = (float(value) if value_column == "batch_time_s" else int(value))
        out["duration"] = duration_s(value) if value_column == "batch_time_s" else duration_us(value)
        for column in ("worker_id", "pid", "rank"):
            if column in row:
                out[column] = None if pd.isna(row[column]) else int(row[column])
        if "worker_id" in row and out["worker_id"] is None and str(row.get("node")) in unrecorded:
            out["worker_id"] = NOT_RECORDED
        elif out.get("worker_id") is not None and out["worker_id"] < 0:
            out["worker_id"] = MAIN_PROCESS  # (the format's -1: a batch loaded in the training process)
        for column in ("node", "type"):
            if column in row:
                out[column] = str(row[column])
        if out.get("rank") is not None and "node" in out:
            out["node"] = f"{out['node']} · rank {out['rank']}"  # the host and, in a distributed job, the rank
        if "type" in out:
            out["type_short"] = short_name(out["type"])
        rows.append(out)
    return rows


def selected_row(selected) -> dict | None:
    """The row an outlier table's selectedRows names (one row, or none)."""
    if isinstance(selected, list) and len(selected) == 1 and isinstance(selected[0], dict):
        return selected[0]
    return None


def selected_mark(row: dict) -> dict:
    """What the timeline marks for a chosen outlier row: its span and a label."""
    return {"start_us": int(row["start_us"]), "end_us": int(row["end_us"]),
            "label": f"selected outlier: {row.get('duration', '')} from {row.get('start', '')}"}


def iterator_rows(iterators: pd.DataFrame) -> list[dict]:
    rows = []
    for row in iterators.to_dict("records"):
        pin = row.get("pin_memory")
        rows.append({"type": str(row["type"]), "type_short": short_name(row["type"]),
                     "num_workers": _int_text(row.get("num_workers")),
                     "pin_memory": "-" if pin is None or pin is pd.NA else str(bool(pin)),
                     "count": int(row["count"]), "median": duration_us(row["median_us"]),
                     "max": duration_us(row["max_us"])})
    return rows


def node_options(trial: Trial) -> list[dict]:
    """The node selector: every host, and under a host of several processes each of them (its
    rank, else its pid), by process id."""
    processes = trial.processes
    options = [{"label": "all nodes", "value": ""}]
    for host in trial.nodes:
        options.append({"label": host, "value": host})
        members = [p for p in processes if p.node == host]
        if len(members) > 1:
            options += [{"label": f"{host} · {p.label}", "value": p.id} for p in members]
    return options


def hosts_text(trial: Trial) -> str:
    """The hosts with their processes: 'algo-1 (ranks 0-3), algo-2 (ranks 4-7)'."""
    parts = []
    for host in trial.nodes:
        members = [p for p in trial.processes if p.node == host]
        ranks = [p.rank for p in members if p.rank is not None]
        if ranks and len(ranks) == len(members):
            span = (f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
                    if ranks == list(range(ranks[0], ranks[-1] + 1)) else "ranks " + ", ".join(map(str, ranks)))
        elif members:
            span = ", ".join(p.label for p in members[:4]) + (f" and {len(members) - 4} more" if len(members) > 4 else "")
        else:
            span = "system metrics only"
        parts.append(f"{host} ({span})")
    return ", ".join(parts)


def summary(whole: Trial) -> dict:
    """Numbers for the summary panel: the whole trial, what was read and what was skipped."""
    start, end = whole.start_us, whole.end_us
    report = whole.report
    skipped = [{"path": s.path, "reason": s.reason} for s in report.files_skipped]
    lines = [{"path": s.path, "reason": s.reason} for s in report.files_with_skipped_lines]
    return {
        "path": whole.path, "start": iso_utc(start), "end": iso_utc(end),
        "duration_s": None if start is None else (end - start) / 1e6,
        "nodes": whole.nodes, "processes": len(whole.processes), "hosts": hosts_text(whole),
        "framework_events": int(len(whole.framework)), "system_samples": int(len(whole.system)),
        "files_read": report.files_read, "files_skipped": skipped, "lines_skipped": report.lines_skipped,
        "values_ignored": report.values_ignored, "files_with_skipped_lines": lines,
    }


NOT_RECORDED = "not recorded"
KINETO_SOURCE = "PyTorch profiler trace"


def not_recorded_note(trial: Trial, what: str) -> str:
    """What a panel says when the trial's profiler did not record `what` (a key of
    NOT_RECORDED_WORDS) on some node; "" when it was recorded everywhere."""
    if what not in trial.not_recorded:
        return ""
    words = NOT_RECORDED_WORDS.get(what, what)
    if not_recorded_anywhere(trial):
        return f"{NOT_RECORDED} ({KINETO_SOURCE}): torch.profiler does not record {words}."
    nodes = ", ".join(trial.kineto_processes)
    return (f"{NOT_RECORDED} on {nodes} ({KINETO_SOURCE}): torch.profiler does not record {words}; "
            f"the numbers here are those of the other nodes.")


def _unrecorded_stats(note: str) -> dict:
    """A panel's numbers when nothing of it was recorded: unknown, never zero. Its figure and
    tables collapse (`collapsed`): the note says it in one line."""
    return {"count": NOT_RECORDED, "median_us": "-", "max_us": "-", "outlier_count": "-", "outliers": [],
            "figure": figures.empty_figure_spec(f"{NOT_RECORDED} ({KINETO_SOURCE})", height=figures.NOTE_PX),
            "note": note, "collapsed": True}


def _duration_stats(stats: dataloader.DurationStats, outliers: list[dict]) -> dict:
    """A duration panel's numbers (count, median, max, outliers) as the page shows them."""
    return {"count": str(stats.count), "median_us": duration_us(stats.median_us),
            "max_us": duration_us(stats.max_us), "outlier_count": str(len(stats.outliers)),
            "outliers": outliers, "collapsed": False}


def panel_body_class(panel: dict) -> str:
    """The className of a panel's figure and tables: collapsed when nothing of it was recorded."""
    return "panel-body collapsed" if panel.get("collapsed") else "panel-body"


def panels(view: TrialView) -> dict:
    """Numbers, figures and table rows of the four panels."""
    result = view.analysis
    init, workers, getnext, batch = result.initialization, result.workers, result.getnext, result.batchtime
    factor = result.dataloader.outlier_factor
    trial = view.trial
    unknown = not_recorded_anywhere(trial)
    no_ids = ({p.node for p in trial.processes if p.id in trial.kineto_processes}
              if "worker_id" in trial.not_recorded else ())
    init_note, workers_note = not_recorded_note(trial, "initialization"), not_recorded_note(trial, "workers")
    if unknown and "initialization" in trial.not_recorded:
        init_panel = {**_unrecorded_stats(init_note), "iterators": iterator_rows(init.iterators)}
    else:
        init_panel = {**_duration_stats(init, outlier_rows(init.outliers, "duration_us")),
                      "iterators": iterator_rows(init.iterators),
                      "figure": figures.initialization_figure_spec(init), "note": init_note}
    if unknown and "workers" in trial.not_recorded:
        workers_panel = _unrecorded_stats(workers_note)
    else:
        workers_panel = {**_duration_stats(workers, outlier_rows(workers.outliers, "duration_us", no_ids)),
                         "figure": figures.workers_figure_spec(workers), "note": workers_note}
    return {
        "init": init_panel,
        "workers": workers_panel,
        "getnext": {**_duration_stats(getnext, outlier_rows(getnext.outliers, "duration_us", no_ids)),
                    "histogram": figures.getnext_histogram_spec(getnext, factor),
                    "timeline": figures.getnext_timeline_spec(getnext, factor)},
        "batchtime": {"count": str(batch.count), "median_s": duration_s(batch.median_s),
                      "outlier_count": str(len(batch.outliers)),
                      "outliers": outlier_rows(batch.outliers, "batch_time_s", no_ids),
                      "figure": figures.batchtime_figure_spec(batch)},
        "outlier_factor": factor,
    }


# --- the verdict and the findings -------------------------------------------------------------

# Evidence lists whose entries are moments of the job, and how one entry is named.
_EVIDENCE_NAMES = {"batches": "batch", "first_batches": "first batch", "starts": "start", "windows": "stall"}


def _evidence_span(entry: dict) -> tuple[int, int] | None:
    """The span of the job an evidence entry names: start_us with end_us or duration_s."""
    start = entry.get("start_us")
    if not isinstance(start, (int, np.integer)):
        return None
    start = int(start)
    if isinstance(entry.get("end_us"), (int, np.integer)):
        return start, int(entry["end_us"])
    if isinstance(entry.get("duration_s"), (int, float)):
        return start, start + int(round(entry["duration_s"] * 1e6))
    return None


def finding_windows(item: Recommendation) -> list[dict]:
    """The moments a finding's evidence names (batches, stalls, worker starts), each as a
    window of the timeline with the margin an outlier click gets."""
    out = []
    for key, entries in item.evidence.items():
        if not isinstance(entries, list):
            continue
        name = _EVIDENCE_NAMES.get(key, key.rstrip("s"))
        for number, entry in enumerate(entries, 1):
            if not isinstance(entry, dict):
                continue
            span = _evidence_span(entry)
            if span is None or span[1] < span[0]:
                continue
            if key == "batches" and "batch" in entry:
                label = f"batch {entry['batch']}" + (f" of iterator {entry['iterator']}" if "iterator" in entry
                                                     else "")
            else:
                label = f"{name} {number}"
            lo, hi = outlier_window(*span)
            out.append({"label": f"{label} · {duration_us(span[1] - span[0])}", "start_us": lo,
                        "end_us": hi, "at": iso_utc(span[0])})
    return out


def not_recorded_text(trial: Trial) -> str:
    """The summary's line on what the trial's profiler did not record ("" when nothing)."""
    if not trial.not_recorded:
        return ""
    where = "" if not_recorded_anywhere(trial) else f" on {', '.join(trial.kineto_processes)}"
    return (f"Not recorded{where} ({KINETO_SOURCE}): "
            + ", ".join(NOT_RECORDED_WORDS.get(k, k) for k in trial.not_recorded)
            + f"; shown as \"{NOT_RECORDED}\", never as zero.")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def verdict_summary(view: TrialView) -> dict:
    """The summary's first part: is the job input-bound, per node, and what to change."""
    assessment = view.assessment
    verdict = assessment.verdict
    nodes = assessment.nodes_verdict
    return {
        "class": verdict.class_ or "none",
        "percent": _percent(verdict.input_percent),
        "basis": verdict.basis,
        "node": selection_label(view.trial, view.analysis.node),
        "nodes": [{"node": node, "class": v.class_ or "none", "percent": _percent(v.input_percent),
                   "basis": v.basis} for node, v in nodes.items()] if len(nodes) > 1 else [],
        "findings": [_finding(item, assessment) for item in assessment.recommendations],
        "no_findings": no_findings_reason(item.evidence.get("no_findings_reason") for item in assessment.budget),
        "not_recorded": not_recorded_text(view.trial),
    }


RANK_BUCKETS = 120  # columns of the rank heat map: the figure gets buckets, never events


def rank_heatmap_view(waits: ranks.RankWaits, order: str, window: tuple[int, int] | None) -> dict:
    """The rank heat map of the whole job (hidden for a job of one process), the window marked."""
    if len(waits.processes) < 2:
        return {"figure": figures.empty_figure_spec("one process: no ranks to compare", height=120),
                "class": "panel ranks hidden", "note": ""}
    heat = ranks.heatmap(waits, buckets=RANK_BUCKETS, order=order if order in ranks.ORDERS else "host")
    row, bucket = heat.hottest
    hosts = len({p.node for p in heat.processes})
    note = (f"{len(heat.processes)} processes on {hosts} host(s), {duration_us(int(heat.edges_us[1] - heat.edges_us[0]))} "
            f"per column. Most waiting: {heat.labels[row]}, {100 * heat.share[row, bucket]:.0f} % of the column "
            f"from {iso_utc(int(heat.edges_us[bucket]))}.")
    return {"figure": figures.rank_heatmap_spec(heat, window), "class": "panel ranks", "note": note}


def rank_cell(click, waits: ranks.RankWaits | None) -> tuple[str, int, int] | None:
    """(process id, start_us, end_us) of a clicked heat-map cell, None for anything else.

    Dash passes a heat-map click's x (the column's middle, as a date) and y (the row: the process
    id), not its customdata: the column is found again among the heat map's own edges."""
    try:
        point = click["points"][0]
        process, x = str(point["y"]), datetime.fromisoformat(str(point["x"])).replace(tzinfo=timezone.utc)
    except (TypeError, KeyError, IndexError, ValueError):
        return None
    if waits is None or process not in {w.process.id for w in waits.processes}:
        return None
    edges = ranks.bucket_edges(waits.start_us, waits.end_us, RANK_BUCKETS)
    middle_us = round(x.timestamp() * 1e6)
    column = int(np.searchsorted(edges, middle_us, side="right")) - 1
    if not 0 <= column < len(edges) - 1:
        return None
    return process, int(edges[column]), int(edges[column + 1])


def selection_label(trial: Trial, node: str | None) -> str:
    """How the page names the host or process the view is scoped to ("" for the whole job)."""
    for process in trial.processes if node and node not in trial.nodes else ():
        if process.id == node:
            return f"{process.node} · {process.label}"
    return node or ""


def change_text(change: dict | None) -> str:
    """A DataLoader change as its arguments: 'num_workers=4, persistent_workers=True'."""
    return ", ".join(f"{key}={value}" for key, value in (change or {}).items())


def _finding_what_if(item: Recommendation, assessment: Assessment) -> WhatIf | None:
    """The what-if a finding's prediction came from (its loader's numbers today and with it)."""
    if item.predicted is None:
        return None
    for result in assessment.what_if:
        if (result.process == item.evidence.get("process") and result.change == item.change
                and result.predicted == item.predicted):
            return result
    return None


def prediction_text(now: dict | None, then: dict) -> str:
    """The report's prediction_text, with the page's arrow."""
    return _prediction_text(now, then, arrow="→")


def _finding(item: Recommendation, assessment: Assessment) -> dict:
    """A finding as the summary lists it: its text, saving, predicted effect and windows.

    The predicted effect gets a line of its own, so the text drops the sentence that
    repeats it."""
    result = _finding_what_if(item, assessment)
    text = item.text
    predicted = None
    if item.predicted is not None:
        sentence = predicted_text(result) if result is not None else ""
        if sentence and sentence in text:
            text = text.replace(sentence, "", 1).rstrip()
        predicted = {"change": change_text(item.change),
                     "text": prediction_text(result.now if result is not None else None, item.predicted),
                     "loader": loader_key(result.node, result.loader) if result is not None else ""}
    return {"id": item.id, "text": text, "saving": saving_text(item.saving_s), "predicted": predicted,
            "windows": finding_windows(item)}


# --- the wait budget and the what-if ----------------------------------------------------------

# Where a click on a budget bar finds its window: customdata[2], customdata[3] (epoch us).
BUDGET_WINDOW_AT = (2, 3)
MAX_BUDGET_ROWS = 24  # loaders drawn at most (those waiting most): a node's own view has them all


def loader_label(node: str, loader: str) -> str:
    return f"{loader} on {node}"


def loader_key(node: str, loader: str) -> str:
    """The what-if's loader selector value of a loader (a node and a loader label)."""
    return f"{node} | {loader}"


def _part_window(spans) -> dict | None:
    """A part's window: its longest GetNext (the first of its spans), with an outlier's margin."""
    if not spans:
        return None
    start, end = (int(v) for v in spans[0])
    lo, hi = outlier_window(start, end)
    return {"start_us": lo, "end_us": hi, "at": iso_utc(start), "wait_s": (end - start) / 1e6,
            "count": len(spans)}


def _budget_row(item: LoaderBudget) -> dict:
    return {"key": loader_key(item.node, item.loader), "label": loader_label(item.node, item.loader),
            "node": item.node, "loader": item.loader, "process": getattr(item, "process", None),
            # The iterator class the loader's label starts with ('_MultiProcessingDataLoaderIter (num_workers=4)').
            "iterator": item.loader.rsplit(" (", 1)[0], "training_s": float(item.training_s),
            "wait_s": float(item.wait_s), "parts": {p: float(item.parts.get(p, 0.0)) for p in PARTS},
            "windows": {p: w for p in PARTS if (w := _part_window(item.windows.get(p))) is not None},
            "bound": item.bound}


def budget_rows(view: TrialView) -> list[dict]:
    """Each training loader's wait budget as the page draws it, in the assessment's order
    (the MAX_BUDGET_ROWS waiting most, when there are more)."""
    return budget_rows_of(view.assessment)


def budget_rows_of(assessment: Assessment) -> list[dict]:
    """budget_rows of an assessment."""
    rows = [_budget_row(item) for item in assessment.budget]
    if len(rows) > MAX_BUDGET_ROWS:
        keep = set(sorted(range(len(rows)), key=lambda i: -rows[i]["wait_s"])[:MAX_BUDGET_ROWS])
        rows = [row for i, row in enumerate(rows) if i in keep]
    return rows


def budget_view(view: TrialView) -> dict:
    """The wait budget block: its figure, the what-if's loader choices and a note."""
    rows = budget_rows(view)
    total = len(view.assessment.budget)
    note = "" if total <= len(rows) else (f"The {len(rows)} of {total} loaders that wait most; "
                                          f"choose a node to see its own.")
    options = [{"label": "all loaders", "value": ""}] + [{"label": row["label"], "value": row["key"]}
                                                         for row in rows]
    return {"figure": figures.budget_figure_spec(rows, PART_WORDS), "rows": rows, "note": note,
            "loader_options": options, "several_loaders": len(rows) > 1}


def budget_click_window(click_data) -> tuple[int, int] | None:
    """The window a click on a budget bar names: its part's longest wait (None for a part
    without one, the "not waiting" rest, or anything unexpected)."""
    try:
        custom = click_data["points"][0]["customdata"]
        start, end = custom[BUDGET_WINDOW_AT[0]], custom[BUDGET_WINDOW_AT[1]]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(start, (int, float)) or not isinstance(end, (int, float)) or isinstance(start, bool):
        return None
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        return None
    return int(start), int(end)


def what_if_change(num_workers=None, prefetch_factor=None, in_order=None, persistent_workers=None) -> dict:
    """The settings a user gave (an empty field or "unchanged" means unchanged), as typed:
    the library validates them."""
    values = dict(zip(WHAT_IF_KEYS, (num_workers, prefetch_factor, in_order, persistent_workers)))
    return {key: value for key, value in values.items()
            if value is not None and not (isinstance(value, str) and not value.strip())
            and not (isinstance(value, float) and not math.isfinite(value))}


def what_if_inputs(change: dict | None) -> dict:
    """The what-if fields' values that show `change`: numbers as they are (None: empty),
    booleans as the dropdowns' "true"/"false" ("": unchanged)."""
    change = change or {}
    out = {}
    for key in WHAT_IF_KEYS:
        value = change.get(key)
        if key in ("in_order", "persistent_workers"):
            out[key] = "" if value is None else str(value).lower()
        else:
            out[key] = value
    return out


def _now(row: dict) -> dict:
    training = row["training_s"]
    return {"wait_s": row["wait_s"], "training_s": training,
            "wait_fraction": row["wait_s"] / training if training > 0 else 0.0}


def what_if_view(view: TrialView, change: dict, loader: str | None = "") -> dict:
    """Today's wait and, with `change`, the predicted wait and training time of each
    training loader (or of the one `loader` names). An empty change predicts nothing.
    ValueError, with the library's message, for a bad setting."""
    return what_if_view_of(view.assessment, change, loader)


def what_if_view_of(assessment: Assessment, change: dict, loader: str | None = "") -> dict:
    """what_if_view of an assessment: the trial's events are not needed."""
    rows = budget_rows_of(assessment)
    results = assessment.predict(change) if change else None
    by_key = {}
    for result in results or []:
        by_key.setdefault(loader_key(result.node, result.loader), result)
    shown = [row for row in rows if row["key"] == loader] or rows
    out = []
    for row in shown:
        result = by_key.get(row["key"])
        item = {"key": row["key"], "label": row["label"], "now": _now(row), "predicted": None, "note": "",
                "text": ""}
        if result is not None and result.predicted is not None:
            then = result.predicted
            item["predicted"] = {"wait_fraction": float(then["wait_fraction"]),
                                 "training_s": float(then["training_s"]),
                                 "wait_s": float(then["wait_fraction"]) * float(then["training_s"])}
            saving = result.saving_s
            item["text"] = prediction_text(result.now, then) + (
                f" (saves {duration_s(saving)})" if saving >= 0 else f" (adds {duration_s(-saving)} of waiting)")
            item["note"] = result.note
        elif result is not None:
            item["note"] = result.note
            item["text"] = f"no prediction: {result.note}"
        out.append(item)
    return {"change": change_text(results[0].change) if results else "", "rows": out,
            "figure": figures.what_if_figure_spec(out)}


def load_error_text(exc: TrialError) -> str:
    """What the page says when a trial cannot be loaded."""
    # The store's messages name the path as typed: s3://key:secret@bucket must not come back whole.
    text = redact(str(exc))
    if isinstance(exc, TrialTooLargeError):
        return (f"{text}. This server refuses larger trials: its limits are --max-trial-mb and --max-events "
                f"(DASHBOARD_MAX_TRIAL_MB, DASHBOARD_MAX_EVENTS).")
    return text


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")



# --- downloads: the outlier tables as CSV, the analysis as JSON, the window as a trace ---------

# An outlier table's CSV: its rows as the table holds them (the moments in ISO and in epoch
# microseconds, the value raw and as written), then who waited.
OUTLIER_CSV_FIELDS = {"duration_us": ["start", "end", "start_us", "end_us", "duration_us", "duration", "worker_id",
                                      "pid", "node", "type"],
                      "batch_time_s": ["start", "end", "start_us", "end_us", "batch_time_s", "duration", "worker_id",
                                       "pid", "node"]}


def outlier_csv(rows: list[dict]) -> str:
    """An outlier table's rows (outlier_rows()) as CSV text, with a header line."""
    value = "batch_time_s" if rows and "batch_time_s" in rows[0] else "duration_us"
    fields = [f for f in OUTLIER_CSV_FIELDS[value] if not rows or f in rows[0]]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
    return out.getvalue()


def download_name(trial_path: str, what: str, extension: str) -> str:
    """A download's file name: the trial folder's name, then what it holds ('job-1-analysis.json')."""
    base = trial_path.rstrip("/").rsplit("/", 1)[-1] or "trial"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{base}-{what}")[:120] + extension


def analysis_json(view: TrialView) -> str:
    """The view's trial (or node) as the `analyze --json` object, with its cached assessment."""

    result = dataclasses.replace(view.analysis)
    result.__dict__["assessment"] = view.assessment  # TrialAnalysis.assessment is a cached_property
    return json.dumps(to_dict(result), allow_nan=False)


def window_trace_json(view: TrialView, start_us: int, end_us: int, select_events: str | None = ".*",
                      select_dimensions: str | None = ".*") -> str:
    """The window as a Chrome/Perfetto JSON trace (`app.py export`), with the window's filters."""

    trace = chrome_trace(view.trial.framework, view.trial.system, int(start_us), int(end_us),
                         _patterns(select_events), _patterns(select_dimensions))
    return json.dumps(trace, allow_nan=False)
