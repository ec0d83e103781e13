"""What the callbacks send: the panels of a loaded trial and the window payload.

Plain functions of a loaded trial, so the benchmark can time them without a browser:

    view = trial_view(dashboard.load_trial(path))               # once per load
    payload = window_payload(view, start_us, end_us)          # every brush on the overview
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from ..analysis import dataloader
from ..analysis.dataloader import DEFAULT_OUTLIER_FACTOR, DataLoaderAnalysis
from ..analysis.diagnosis import PARTS, WHAT_IF_KEYS, Assessment, LoaderBudget, Recommendation, WhatIf
from ..analysis.diagnosis.findings.base import predicted_text
from ..api import TrialAnalysis
from ..report import NOT_RECORDED_WORDS, PART_WORDS, iso_utc, not_recorded_anywhere
from ..trial.errors import TrialError, TrialTooLargeError
from ..trial.load import Trial, host_of
from . import figures

# Clicking an outlier shows it with this much of its own length on each side (at least
# MIN_MARGIN_US), so what happened just before and after is in view.
OUTLIER_MARGIN = 0.5
MIN_MARGIN_US = 1_000
MAX_TABLE_ROWS = 500  # longest outliers listed; the count says how many there are
MAX_SAMPLE_GAP_US = 60_000_000  # the slowest system sampling there is
DRAGMODES = ("zoom", "pan", "select")  # what the overview's mode bar offers


@dataclass
class TrialView:
    """A loaded trial (or one node of it) with what every figure reuses."""
    trial: Trial
    analysis: TrialAnalysis
    overview: figures.OverviewSeries
    key: str = ""
    sample_gap_us: int = 0  # the usual time between two system samples
    precomputed_assessment: Assessment | None = None  # from the trial cache, when it has one

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

def parse_time_us(value) -> int | None:
    """Epoch microseconds from a plotly date string ('2026-11-29 21:10:08.4312', taken as UTC),
    an ISO-8601 string, or a number (epoch us). None when it is none of them."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value) if math.isfinite(value) else None
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        stamp = pd.Timestamp(text)
    except (ValueError, TypeError):
        return None
    if stamp is pd.NaT:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.tz_localize("UTC")
    return int(stamp.value // 1000)


def range_from_ms(value) -> int | None:
    """A plotly date-axis range end: a date string, or a number of epoch milliseconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(round(value * 1000)) if math.isfinite(value) else None
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


def outlier_window(start_us: int, end_us: int) -> tuple[int, int]:
    margin = max(int((end_us - start_us) * OUTLIER_MARGIN), MIN_MARGIN_US)
    return start_us - margin, end_us + margin


def window_text(start_us: int, end_us: int) -> str:
    return f"{iso_utc(start_us)} – {iso_utc(end_us)}"


# --- the window -------------------------------------------------------------------------------

def _patterns(text: str | None) -> list[str]:
    return [text] if text and text.strip() else [".*"]


def check_patterns(select_events: str | None, select_dimensions: str | None) -> None:
    """ValueError naming the first of the two filters that is not a valid regular expression."""
    dataloader.validate_patterns(_patterns(select_events))
    dataloader.validate_patterns(_patterns(select_dimensions))


def window_payload(view: TrialView, start_us: int, end_us: int, select_events: str | None = ".*",
                   select_dimensions: str | None = ".*", dragmode: str | None = None) -> dict:
    """Everything a new window sends: the detail timeline, the refined overview and the range
    text. ValueError (naming the pattern) for an invalid regular expression."""
    start_us, end_us = int(start_us), int(end_us)
    # One sampling interval more on each side: metric lines then cross the window's edges.
    pad = view.sample_gap_us
    window = view.analysis.window(start_us - pad, end_us + pad, _patterns(select_events),
                                  _patterns(select_dimensions))
    revision = view.key or "trial"
    window_revision = f"{revision}:{start_us}:{end_us}"
    return {
        "window_figure": figures.window_figure_spec(window, uirevision=revision, x_range=(start_us, end_us),
                                                    range_revision=window_revision),
        "overview_figure": figures.overview_figure_spec(view.overview, (start_us, end_us), uirevision=revision,
                                                        range_revision=window_revision,
                                                        dragmode=dragmode if dragmode in DRAGMODES else "zoom"),
        "window_range": window_text(start_us, end_us),
    }


# --- the panels -------------------------------------------------------------------------------

def plain_number(value, decimals: int) -> str:
    """A number as tests and people read it: no thousands separator, no trailing zeros."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    text = f"{float(value):.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _int_text(value) -> str:
    return "-" if value is None or value is pd.NA else str(int(value))


def outlier_rows(frame: pd.DataFrame, value_column: str, unrecorded_nodes=()) -> list[dict]:
    """Table rows for an outliers frame (longest first); raw times ride along for clicks.

    unrecorded_nodes: nodes whose profiler does not record worker ids (Kineto traces): their
    unknown worker id reads "not recorded", not a blank or a number."""
    rows = []
    unrecorded = set(unrecorded_nodes)
    for i, row in enumerate(frame.head(MAX_TABLE_ROWS).to_dict("records")):
        out = {"id": i, "start_us": int(row["start_us"]), "end_us": int(row["end_us"]),
               "start": iso_utc(int(row["start_us"])), "end": iso_utc(int(row["end_us"]))}
        value = row[value_column]
        out[value_column] = (float(value) if value_column == "batch_time_s" else int(value))
        for column in ("worker_id", "pid"):
            if column in row:
                out[column] = None if pd.isna(row[column]) else int(row[column])
        if "worker_id" in row and out["worker_id"] is None and str(row.get("node")) in unrecorded:
            out["worker_id"] = NOT_RECORDED
        for column in ("node", "type"):
            if column in row:
                out[column] = str(row[column])
        rows.append(out)
    return rows


def selected_row(selected) -> dict | None:
    """The row an outlier table's selectedRows names (one row, or none)."""
    if isinstance(selected, list) and len(selected) == 1 and isinstance(selected[0], dict):
        return selected[0]
    return None


def iterator_rows(iterators: pd.DataFrame) -> list[dict]:
    rows = []
    for row in iterators.to_dict("records"):
        pin = row.get("pin_memory")
        rows.append({"type": str(row["type"]), "num_workers": _int_text(row.get("num_workers")),
                     "pin_memory": "-" if pin is None or pin is pd.NA else str(bool(pin)),
                     "count": int(row["count"]), "median_us": plain_number(row["median_us"], 1),
                     "max_us": plain_number(row["max_us"], 1)})
    return rows


def node_options(trial: Trial) -> list[dict]:
    """The node selector: every host, and the framework node ids of hosts that have several."""
    nodes = trial.nodes
    hosts = sorted({host_of(n) for n in nodes})
    options = [{"label": "all nodes", "value": ""}]
    for host in hosts:
        options.append({"label": host, "value": host})
        members = [n for n in nodes if n != host and host_of(n) == host]
        if len(members) > 1:
            options += [{"label": f"  {n}", "value": n} for n in members]
    return options


def summary(whole: Trial) -> dict:
    """Numbers for the summary panel: the whole trial, what was read and what was skipped."""
    start, end = whole.start_us, whole.end_us
    framework = whole.framework
    processes = framework[["node", "pid"]].dropna().drop_duplicates() if len(framework) else framework
    report = whole.report
    skipped = [{"path": s.path, "reason": s.reason} for s in report.files_skipped]
    lines = [{"path": s.path, "reason": s.reason} for s in report.files_with_skipped_lines]
    return {
        "path": whole.path, "start": iso_utc(start), "end": iso_utc(end),
        "duration_s": None if start is None else (end - start) / 1e6,
        "nodes": whole.nodes, "processes": int(len(processes)),
        "framework_events": int(len(whole.framework)), "system_samples": int(len(whole.system)),
        "files_read": report.files_read, "files_skipped": skipped, "lines_skipped": report.lines_skipped,
        "files_with_skipped_lines": lines,
    }


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.3f} s"
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours} h {minutes:02d} min {secs:04.1f} s" if hours else f"{minutes} min {secs:04.1f} s"


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
    nodes = ", ".join(trial.kineto_nodes)
    return (f"{NOT_RECORDED} on {nodes} ({KINETO_SOURCE}): torch.profiler does not record {words}; "
            f"the numbers here are those of the other nodes.")


def _unrecorded_stats(note: str) -> dict:
    """A panel's numbers when nothing of it was recorded: unknown, never zero."""
    return {"count": NOT_RECORDED, "median_us": "-", "max_us": "-", "outlier_count": "-", "outliers": [],
            "figure": figures.empty_figure_spec(f"{NOT_RECORDED} ({KINETO_SOURCE})"), "note": note}


def _duration_stats(stats: dataloader.DurationStats, outliers: list[dict]) -> dict:
    """A duration panel's numbers (count, median, max, outliers) as the page shows them."""
    return {"count": str(stats.count), "median_us": plain_number(stats.median_us, 1),
            "max_us": plain_number(stats.max_us, 1), "outlier_count": str(len(stats.outliers)),
            "outliers": outliers}


def panels(view: TrialView) -> dict:
    """Numbers, figures and table rows of the four panels."""
    result = view.analysis
    init, workers, getnext, batch = result.initialization, result.workers, result.getnext, result.batchtime
    factor = result.dataloader.outlier_factor
    trial = view.trial
    unknown = not_recorded_anywhere(trial)
    no_ids = trial.kineto_nodes if "worker_id" in trial.not_recorded else ()
    init_note, workers_note = not_recorded_note(trial, "initialization"), not_recorded_note(trial, "workers")
    if unknown and "initialization" in trial.not_recorded:
        init_panel = {**_unrecorded_stats(init_note), "iterators": iterator_rows(init.iterators)}
    else:
        init_panel = {**_duration_stats(init, outlier_rows(init.outliers, "duration_us")),
                      "iterators": iterator_rows(init.iterators),
                      "figure": figures.initialization_figure(init), "note": init_note}
    if unknown and "workers" in trial.not_recorded:
        workers_panel = _unrecorded_stats(workers_note)
    else:
        workers_panel = {**_duration_stats(workers, outlier_rows(workers.outliers, "duration_us", no_ids)),
                         "figure": figures.workers_figure(workers), "note": workers_note}
    return {
        "init": init_panel,
        "workers": workers_panel,
        "getnext": {**_duration_stats(getnext, outlier_rows(getnext.outliers, "duration_us", no_ids)),
                    "histogram": figures.getnext_histogram(getnext, factor),
                    "timeline": figures.getnext_timeline(getnext, factor)},
        "batchtime": {"count": str(batch.count), "median_s": plain_number(batch.median_s, 7),
                      "outlier_count": str(len(batch.outliers)),
                      "outliers": outlier_rows(batch.outliers, "batch_time_s", no_ids),
                      "figure": figures.batchtime_figure(batch)},
        "outlier_factor": factor,
    }


# --- the verdict and the findings -------------------------------------------------------------

# Evidence lists whose entries are moments of the job, and how one entry is named.
_EVIDENCE_NAMES = {"batches": "batch", "first_batches": "first batch", "starts": "start", "windows": "stall"}


def saving_text(saving_s: float | None) -> str:
    return "" if saving_s is None else f"saves about {saving_s:.2f} s"


def _duration_text(us: int) -> str:
    return f"{us / 1e6:.2f} s" if us >= 1_000_000 else f"{us / 1e3:.1f} ms"


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
            out.append({"label": f"{label} · {_duration_text(span[1] - span[0])}", "start_us": lo,
                        "end_us": hi, "at": iso_utc(span[0])})
    return out


def not_recorded_text(trial: Trial) -> str:
    """The summary's line on what the trial's profiler did not record ("" when nothing)."""
    if not trial.not_recorded:
        return ""
    where = "" if not_recorded_anywhere(trial) else f" on {', '.join(trial.kineto_nodes)}"
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
        "node": view.analysis.node or "",
        "nodes": [{"node": node, "class": v.class_ or "none", "percent": _percent(v.input_percent),
                   "basis": v.basis} for node, v in nodes.items()] if len(nodes) > 1 else [],
        "findings": [_finding(item, assessment) for item in assessment.recommendations],
        "not_recorded": not_recorded_text(view.trial),
    }


def change_text(change: dict | None) -> str:
    """A DataLoader change as its arguments: 'num_workers=4, persistent_workers=True'."""
    return ", ".join(f"{key}={value}" for key, value in (change or {}).items())


def _finding_what_if(item: Recommendation, assessment: Assessment) -> WhatIf | None:
    """The what-if a finding's prediction came from (its loader's numbers today and with it)."""
    if item.predicted is None:
        return None
    for result in assessment.what_if:
        if (result.node == item.evidence.get("node") and result.change == item.change
                and result.predicted == item.predicted):
            return result
    return None


def prediction_text(now: dict | None, then: dict) -> str:
    """'waiting 81.6 % → 74.0 % of training, training 18.98 s → 13.44 s' (without today's
    numbers when they are not known)."""
    if now is None:
        return f"waiting {100 * then['wait_fraction']:.1f} % of training, training {then['training_s']:.2f} s"
    return (f"waiting {100 * now['wait_fraction']:.1f} % → {100 * then['wait_fraction']:.1f} % of training, "
            f"training {now['training_s']:.2f} s → {then['training_s']:.2f} s")


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
            "node": item.node, "loader": item.loader, "training_s": float(item.training_s),
            "wait_s": float(item.wait_s), "parts": {p: float(item.parts.get(p, 0.0)) for p in PARTS},
            "windows": {p: w for p in PARTS if (w := _part_window(item.windows.get(p))) is not None},
            "bound": item.bound}


def budget_rows(view: TrialView) -> list[dict]:
    """Each training loader's wait budget as the page draws it, in the assessment's order
    (the MAX_BUDGET_ROWS waiting most, when there are more)."""
    rows = [_budget_row(item) for item in view.assessment.budget]
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
    rows = budget_rows(view)
    results = view.assessment.predict(change) if change else None
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
                f" (saves {saving:.2f} s)" if saving >= 0 else f" (adds {-saving:.2f} s of waiting)")
            item["note"] = result.note
        elif result is not None:
            item["note"] = result.note
            item["text"] = f"no prediction: {result.note}"
        out.append(item)
    return {"change": change_text(results[0].change) if results else "", "rows": out,
            "figure": figures.what_if_figure_spec(out)}


def load_error_text(exc: TrialError) -> str:
    """What the page says when a trial cannot be loaded."""
    if isinstance(exc, TrialTooLargeError):
        return (f"{exc}. This server refuses larger trials: its limits are --max-trial-mb and --max-events "
                f"(DASHBOARD_MAX_TRIAL_MB, DASHBOARD_MAX_EVENTS).")
    return str(exc)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")

