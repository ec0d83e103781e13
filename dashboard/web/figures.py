"""Plotly figures from analysis results. No Dash here: the compatibility API's
`plot_the_window` draws `window_figure` too.

Times are drawn on date axes as float epoch milliseconds (plotly reads numbers on a date
axis as ms since the epoch, UTC), which travel to the browser as compact binary arrays.
No figure sends more than about MAX_POINTS points: long series are reduced to the
min and max of each pixel bucket, and Gantt bars that would overlap on screen are merged.
"""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .. import format as fmt
from ..analysis import decimate
from ..analysis.dataloader import BatchTimeResult, DurationStats, InitializationResult, Window, ints_or
from ..display import TIME_ZONE, axis_unit, duration_s, duration_us, durations_us, number_text, short_name, worker_text

MAX_POINTS = 50_000
OVERVIEW_COARSE_BUCKETS = 600
FONT = "Inter, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
# Colours readers with any common colour-vision deficiency tell apart: the Okabe-Ito palette
# (tests/test_display.py checks every event kind's colour against the others under simulated
# protanopia, deuteranopia and tritanopia). Series beyond its eight (many CPU cores) are named
# on hover.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000", "#999999",
           "#F0E442", "#882255", "#44AA99", "#117733"]
OUTLIER_COLOR = "#D55E00"  # vermillion: outliers and GetNext stalls, wherever they are drawn
SELECTED_COLOR = "#000000"  # the outlier a user chose, outlined
# One colour per event kind, none shared (compute steps a light grey: what is not waiting).
PHASE_COLORS = {
    fmt.PHASE_INIT: "#CC79A7",
    fmt.PHASE_ITER: "#0072B2",
    fmt.PHASE_WORKER: "#009E73",
    fmt.PHASE_WORKER_FETCH: "#56B4E9",
    fmt.LEGACY_PHASE_WORKER_FETCH: "#56B4E9",  # the same kind, under its older name
    fmt.PHASE_FIRST_BATCH: "#E69F00",
    fmt.PHASE_STEP_TRAIN: "#C8C8C8",
    fmt.PHASE_STEP_EVAL: "#F0E442",
    fmt.PHASE_EPOCH_END: "#000000",
}
PHASE_ORDER = [fmt.PHASE_INIT, fmt.PHASE_CREATED, fmt.PHASE_FIRST_BATCH, fmt.PHASE_ITER, fmt.PHASE_WORKER,
               fmt.PHASE_WORKER_FETCH, fmt.LEGACY_PHASE_WORKER_FETCH, fmt.PHASE_STEP_TRAIN, fmt.PHASE_STEP_EVAL,
               fmt.PHASE_EPOCH_END]
# Other phases (Kineto's, a newer collector's) take these, in order of appearance: Paul Tol's
# muted colours, apart from the kinds above.
OTHER_PHASE_COLORS = ["#882255", "#44AA99", "#117733", "#332288", "#AA4499", "#999933", "#661100", "#6699CC"]
STALL_NAME = "GetNext stall"
SELECTED_NAME = "selected outlier"
NOTE_PX = 56  # a figure that only says there is nothing to draw: one line
# Date axes read epoch times in UTC (plotly's numbers on a date axis): the title says so.
TIME_AXIS_TITLE = {"text": f"time ({TIME_ZONE})", "standoff": 4, "font": {"size": 11, "color": "#6b7280"}}
MAX_GANTT_ROWS = 40
MAX_LEGEND_ITEMS = 8  # a subplot with more series (many CPU cores) names them on hover only
METRIC_ROW_PX = 120
GANTT_ROW_PX = 22


def plain(text) -> str:
    """Text from a trial (event, metric, node names) made inert for plotly's label markup:
    no tags (plotly renders <a href>, <b>...) and no %{...} template fields."""
    return html.escape(str(text), quote=False).replace("%{", "%\u200b{")


def us_to_ms(values) -> np.ndarray:
    """Epoch microseconds -> float epoch milliseconds, the numbers a plotly date axis reads."""
    return np.asarray(values, dtype="float64") / 1000.0


def typed_array(values) -> dict:
    """A float array as plotly.js's binary array spec (compact; NaN breaks a line)."""
    data = np.ascontiguousarray(values, dtype="<f8")
    return {"dtype": "f8", "bdata": base64.b64encode(data.tobytes()).decode("ascii")}


_AXIS = {"gridcolor": "#e5e7eb", "linecolor": "#9ca3af", "zeroline": False, "ticks": "outside",
         "tickcolor": "#9ca3af", "automargin": True}
# The figures' look, in one place: a small template instead of plotly's bulky defaults.
TEMPLATE = {"layout": {
    "font": {"family": FONT, "size": 12, "color": "#1f2937"}, "paper_bgcolor": "white",
    "plot_bgcolor": "white", "colorway": PALETTE, "hovermode": "closest",
    "hoverlabel": {"font": {"family": FONT}}, "xaxis": _AXIS, "yaxis": _AXIS,
    "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
    "margin": {"l": 60, "r": 20, "t": 30, "b": 40}}}


def empty_figure_spec(message: str, height: int = 260) -> dict:
    return {"data": [], "layout": {
        "template": TEMPLATE, "height": height, "xaxis": {"visible": False}, "yaxis": {"visible": False},
        "annotations": [{"text": message, "showarrow": False, "x": 0.5, "y": 0.5, "xref": "paper",
                         "yref": "paper", "font": {"size": 14, "color": "#6b7280"}}]}}


def n_points(figure) -> int:
    """Points a figure (Figure or dict) sends: the length of every trace's x."""
    data = figure.to_plotly_json()["data"] if isinstance(figure, go.Figure) else figure["data"]
    total = 0
    for trace in data:
        x = trace.get("x")
        if isinstance(x, dict) and "bdata" in x:
            total += len(base64.b64decode(x["bdata"])) // np.dtype(x["dtype"]).itemsize
        elif x is not None:
            total += len(x)
    return total


# --- Gantt bars ----------------------------------------------------------------------------

def _gantt_traces(start_us: np.ndarray, end_us: np.ndarray, rows: np.ndarray, colors: np.ndarray,
                  color_names: list[str], color_values: list[str], hover, gap_us: float,
                  axes: tuple[str, str] = ("x", "y"), line_px: int = 12) -> list[dict]:
    """Horizontal bars as thick line segments (one trace per colour), merging bars of a row
    that lie within `gap_us` of each other (closer than a pixel).

    colors: per event, an index into color_names/color_values; hover(positions) -> the
    texts of the events at those positions (only called for bars drawn alone).
    Each bar is drawn as start, middle, end, gap: hovering anywhere on it shows its text.
    """
    traces = []
    for code, (name, value) in enumerate(zip(color_names, color_values)):
        positions = np.flatnonzero(colors == code)
        if not len(positions):
            continue
        s, e, g, count, first = decimate.merge_intervals(start_us[positions], end_us[positions],
                                                         rows[positions], gap_us)
        n = len(s)
        x = np.empty(n * 4)
        x[0::4], x[1::4], x[2::4], x[3::4] = us_to_ms(s), us_to_ms((s + e) / 2), us_to_ms(e), np.nan
        y = np.empty(n * 4)
        y[0::4] = y[1::4] = y[2::4] = g
        y[3::4] = np.nan
        single = count == 1
        alone = iter(hover(positions[first[single]]) if single.any() else [])
        texts = []
        for c, is_single, bs, be in zip(count.tolist(), single.tolist(), s.tolist(), e.tolist()):
            text = next(alone) if is_single else (
                f"{c:,} {plain(name)} events merged at this zoom<br>{duration_us(be - bs)} span")
            texts += [text, text, text, ""]
        traces.append({"type": "scatter", "x": typed_array(x), "y": typed_array(y), "mode": "lines",
                       "name": plain(name), "legendgroup": f"gantt-{name}", "xaxis": axes[0], "yaxis": axes[1],
                       "line": {"color": value, "width": line_px}, "hovertext": texts,
                       "hoverinfo": "text", "connectgaps": False})
    return traces


def _phase_rank(phase: str) -> tuple:
    return (PHASE_ORDER.index(phase), phase) if phase in PHASE_ORDER else (len(PHASE_ORDER), phase)


def _event_hover(frame: pd.DataFrame):
    """hover(positions) for _gantt_traces: name, duration, pid and worker of events of `frame`."""
    def hover(positions: np.ndarray) -> list[str]:
        part = frame.iloc[positions]
        out = []
        for name, pid, worker, dur in zip(part["name"].astype(str).tolist(), part["pid"].tolist(),
                                          part["worker_id"].tolist(), part["duration_us"].tolist()):
            text = f"{plain(name)}<br>{duration_us(dur)}<br>pid {'?' if pid is pd.NA else pid}"
            if worker is not pd.NA:
                text += f", {worker_text(worker)}"
            out.append(text)
        return out
    return hover


def _host(node: str) -> str:
    head, sep, rest = node.partition("-")
    return rest if sep and head.isdigit() else node


def _category_codes(values: pd.Series) -> tuple[np.ndarray, list[str]]:
    """(codes, names) of a column, -1 for missing: cheap for the frames' categoricals."""
    values = values if values.dtype.name == "category" else values.astype("category")
    return values.cat.codes.to_numpy(), [str(c) for c in values.cat.categories]


@dataclass
class GanttRows:
    row: np.ndarray  # per event, its row index
    labels: list[str]  # per row, its label (top to bottom)


def gantt_rows(frame: pd.DataFrame, max_rows: int = MAX_GANTT_ROWS) -> GanttRows:
    """Rows of the framework Gantt: one per (host, phase, process).

    With more rows than fit, worker processes are grouped by worker id (a new process per
    epoch is still worker k), then by phase alone.
    """
    if frame.empty:
        return GanttRows(np.array([], dtype="int64"), [])
    node_codes, node_names = _category_codes(frame["node"])
    host_names = sorted({_host(n) for n in node_names})
    host_of_node = np.array([host_names.index(_host(n)) for n in node_names] + [len(host_names)])
    hosts = host_of_node[node_codes]  # code -1 picks the appended "unknown host"
    host_names.append("?")
    phase_codes, phase_names = _category_codes(frame["phase"])
    phase_names.append("?")
    worker_like = np.array([p in (fmt.PHASE_WORKER, fmt.PHASE_WORKER_FETCH) for p in phase_names])[phase_codes]
    pids, workers = ints_or(frame["pid"], -1), ints_or(frame["worker_id"], -1)
    tag_names = ["pid", "worker", ""]
    for level in ("pid", "worker", "phase"):
        if level == "pid":
            who, tag = pids, np.zeros(len(frame), dtype="int64")
        elif level == "worker":
            who, tag = np.where(worker_like, workers, pids), worker_like.astype("int64")
        else:
            who, tag = np.full(len(frame), -1, dtype="int64"), np.full(len(frame), 2, dtype="int64")
        phase_index = np.where(phase_codes < 0, len(phase_names) - 1, phase_codes)
        key = ((hosts * len(phase_names) + phase_index) * 3 + tag) * 2**32 + (who + 1)
        codes, uniques = pd.factorize(key)
        if len(uniques) <= max_rows or level == "phase":
            break
    combos = []
    for value in np.asarray(uniques).tolist():
        who = value % 2**32 - 1
        rest = value // 2**32
        tag, rest = rest % 3, rest // 3
        combos.append((host_names[rest // len(phase_names)], phase_names[rest % len(phase_names)],
                       tag_names[tag], who))
    order = sorted(range(len(combos)), key=lambda i: (combos[i][0], _phase_rank(combos[i][1]),
                                                      combos[i][2], combos[i][3]))
    rank = np.empty(len(order), dtype="int64")
    rank[order] = np.arange(len(order))
    multi_host = len({c[0] for c in combos}) > 1
    labels = []
    for i in order:
        host, phase, tag, who = combos[i]
        label = phase if tag == "" else f"{phase} · {tag} {who if who >= 0 else '?'}"
        labels.append(plain(f"{host} · {label}" if multi_host else label))
    return GanttRows(rank[codes], labels)


def phase_colors(phases) -> dict[str, str]:
    """The colour of each phase: its own (PHASE_COLORS), or the next of OTHER_PHASE_COLORS."""
    others = iter(OTHER_PHASE_COLORS * (1 + len(phases) // len(OTHER_PHASE_COLORS)))
    return {p: PHASE_COLORS[p] if p in PHASE_COLORS else next(others) for p in phases}


def stall_label(stall_us: float) -> str:
    return f"{STALL_NAME} (over {duration_us(stall_us)})"


def framework_gantt(frame: pd.DataFrame, rows: GanttRows, span_us: float, budget: int,
                    axes: tuple[str, str] = ("x", "y"), stall_us: float | None = None) -> list[dict]:
    """Gantt traces of framework events, one colour per phase, within about `budget` points.

    GetNexts longer than `stall_us` (the outlier threshold) are stalls: bars of their own
    colour, never merged into their neighbours' bar, and a tick on each (peaks_over), which
    stays visible when the bar is narrower than a pixel."""
    phase_codes, phase_names = _category_codes(frame["phase"])
    present = sorted({phase_names[c] if c >= 0 else "?" for c in np.unique(phase_codes).tolist()},
                     key=_phase_rank)
    colors = phase_colors(present)
    color_of_code = np.array([present.index(p) if p in present else -1 for p in phase_names]
                             + [present.index("?") if "?" in present else -1])
    codes = color_of_code[phase_codes]
    names, values = list(present), [colors[p] for p in present]
    durations = frame["duration_us"].to_numpy(dtype="float64", na_value=np.nan)
    stalls = np.zeros(len(frame), dtype=bool)
    if stall_us is not None and fmt.PHASE_ITER in phase_names:
        stalls = (phase_codes == phase_names.index(fmt.PHASE_ITER)) & (durations > stall_us)
        if stalls.any():
            codes = np.where(stalls, len(names), codes)
            names.append(stall_label(stall_us))
            values.append(OUTLIER_COLOR)
    n_rows = max(1, len(rows.labels))
    bars_per_row = int(np.clip(budget / 4 / n_rows, 100, decimate.DEFAULT_BUCKETS))
    starts, ends = frame["start_us"].to_numpy(), frame["end_us"].to_numpy()
    hover = _event_hover(frame)
    traces = _gantt_traces(starts, ends, rows.row, codes, names, values, hover,
                           gap_us=max(span_us, 1) / bars_per_row, axes=axes)
    if stalls.any():
        traces[-1]["meta"] = "stall-bars"  # the stall colour is the last, so its trace too
        at = np.flatnonzero(stalls)
        middle = (starts[at] + ends[at]) / 2
        keep = at[decimate.peaks_over(middle, durations[at], stall_us)]
        middle = (starts[keep] + ends[keep]) / 2
        traces.append(_ticks(middle, rows.row[keep], names[-1], OUTLIER_COLOR, axes,
                             [f"{STALL_NAME}: {t}" for t in durations_us(durations[keep])], meta="stall-marks"))
    if fmt.PHASE_CREATED in present:
        # An iterator's creation as Kineto shows it is a moment: a bar of no length would not
        # show, a tick does (one per iterator).
        at = np.flatnonzero(phase_codes == phase_names.index(fmt.PHASE_CREATED))
        traces.append(_ticks(starts[at].astype("float64"), rows.row[at], fmt.PHASE_CREATED,
                             colors[fmt.PHASE_CREATED], axes, hover(at)))
    return traces


def _ticks(at_us: np.ndarray, rows: np.ndarray, name: str, color: str, axes: tuple[str, str], hovertext: list[str],
           meta: str | None = None) -> dict:
    """Vertical ticks at moments on Gantt rows, in the legend group of the bars named `name`:
    they show where a bar is narrower than a pixel, or has no length."""
    trace = {"type": "scatter", "x": typed_array(us_to_ms(at_us)), "y": typed_array(rows.astype("float64")),
             "mode": "markers", "name": name, "legendgroup": f"gantt-{name}", "showlegend": False,
             "xaxis": axes[0], "yaxis": axes[1],
             "marker": {"symbol": "line-ns", "size": 16, "line": {"width": 3, "color": color}},
             "hovertext": hovertext, "hoverinfo": "text"}
    return trace if meta is None else {**trace, "meta": meta}


# --- the window: system metrics and framework events ----------------------------------------

_METRIC_GROUPS = [  # (type, dimension or name, what it is, its unit, of what)
    ("cpu", "CPUUtilization", "CPU utilization", "%", "per core"),
    ("cpu", "I/OWaitPercentage", "I/O wait", "%", "per core"),
    ("gpu", "GPUUtilization", "GPU utilization", "%", ""),
    ("gpu", "GPUMemoryUtilization", "GPU memory utilization", "%", ""),
    ("memory", None, "Memory used", "%", ""),
    ("i/o", "IOPS", "I/O operations", "per second", ""),
    ("i/o", None, "I/O throughput", "bytes/s", ""),
    ("network", None, "Network", "bytes/s", ""),
]


@dataclass(frozen=True, order=True)
class MetricGroup:
    """A subplot of the window: the metrics of one kind, in one unit."""
    order: int
    name: str
    unit: str = ""
    of: str = ""

    @property
    def title(self) -> str:
        inside = ", ".join(part for part in (self.unit, self.of) if part)
        return f"{self.name} ({inside})" if inside else self.name

    def flat_text(self, value: float) -> str:
        """The one line a group says when its every series holds one value."""
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.name}: {number_text(value, 3)}{unit} throughout"


def metric_group(type_: str, name: str, dimension: str) -> MetricGroup:
    """The subplot a system metric is drawn in."""
    for order, (group_type, key, what, unit, of) in enumerate(_METRIC_GROUPS):
        if type_ == group_type and (key is None or key in (dimension, name)):
            return MetricGroup(order, what, unit, of)
    return MetricGroup(len(_METRIC_GROUPS), plain(f"{type_} {dimension or name}".strip()))


def _series_label(node: str, name: str, dimension: str, multi_node: bool) -> str:
    keyed_by_dimension = dimension and dimension not in ("CPUUtilization", "I/OWaitPercentage",
                                                         "GPUUtilization", "GPUMemoryUtilization")
    label = f"{name} ({dimension})" if keyed_by_dimension else name
    return plain(f"{node} {label}" if multi_node else label)


def _window_span(window: Window) -> tuple[int, int] | None:
    """The window's bounds; an unbounded side (None) ends where the data does."""
    system, framework = window.system, window.framework
    starts = [v for v in (system["timestamp_us"].min() if len(system) else None,
                          framework["start_us"].min() if len(framework) else None) if v is not None]
    ends = [v for v in (system["timestamp_us"].max() if len(system) else None,
                        framework["end_us"].max() if len(framework) else None) if v is not None]
    lo = window.start_us if window.start_us is not None else (min(starts) if starts else None)
    hi = window.end_us if window.end_us is not None else (max(ends) if ends else None)
    if lo is None or hi is None:
        return None
    return int(lo), int(max(hi, lo + 1))


def _flat_value(ys: list[np.ndarray]) -> float | None:
    """The one value every sample of these series holds, or None (they vary, or hold none)."""
    values = np.concatenate([y[~np.isnan(y)] for y in ys]) if ys else np.array([])
    if not len(values):
        return None
    lo, hi = float(values.min()), float(values.max())
    return lo if hi - lo <= 1e-9 * max(1.0, abs(hi)) else None


BATCH_ROW_PX = 110
WAIT_NAME = "waiting for the batch (GetNext)"
COMPUTE_NAME = "computing until the next"


@dataclass
class BatchBars:
    """Wait against compute of one loader, as the window draws them: one bar per batch, or per
    bucket of batches (then each bar the bucket's mean per batch). Times epoch us."""
    loader: str
    start_us: np.ndarray
    end_us: np.ndarray
    wait_us: np.ndarray
    compute_us: np.ndarray  # NaN: not known (an iterator's last batch)
    batches: np.ndarray  # how many batches a bar stands for
    first: np.ndarray  # the number (0-based, in the loader's order) of a bar's first batch


def batch_traces(bars: BatchBars, axes: tuple[str, str]) -> tuple[list[dict], str]:
    """The stacked bars of wait on compute, and the unit of their axis."""
    compute = np.nan_to_num(bars.compute_us, nan=0.0)
    unit = axis_unit(float(np.max(bars.wait_us + compute)) if len(compute) else 0.0)
    # Thin: each bar takes most of its own span, so the gaps show where one batch ends.
    span_ms = np.maximum((bars.end_us - bars.start_us) / 1000.0, 0.0)
    width = (span_ms * 0.8).tolist()
    x = us_to_ms(bars.start_us + (bars.end_us - bars.start_us) * 0.1).tolist()
    texts = []
    for n, first, wait, comp in zip(bars.batches.tolist(), bars.first.tolist(), bars.wait_us.tolist(),
                                    bars.compute_us.tolist()):
        which = f"batch {first + 1:,}" if n == 1 else f"batches {first + 1:,}–{first + n:,} (mean per batch)"
        computes = "not known (the iterator's last)" if not np.isfinite(comp) else duration_us(comp)
        texts.append(f"{which}<br>waits {duration_us(wait)}<br>computes {computes}")
    common = {"type": "bar", "x": x, "width": width, "offset": 0, "xaxis": axes[0], "yaxis": axes[1],
              "hovertext": texts, "hoverinfo": "text", "legend": "legend", "showlegend": True}
    return [
        {**common, "name": WAIT_NAME, "y": (bars.wait_us / unit.us).tolist(), "meta": "batch-wait",
         "marker": {"color": PHASE_COLORS[fmt.PHASE_ITER], "line": {"width": 0}}},
        {**common, "name": COMPUTE_NAME, "y": (compute / unit.us).tolist(), "meta": "batch-compute",
         "marker": {"color": PHASE_COLORS[fmt.PHASE_STEP_TRAIN], "line": {"width": 0}}},
    ], unit.name


def selected_mark(selected: dict, axes: tuple[str, str], y_range: tuple[float, float]) -> dict:
    """An outline around the chosen outlier's time, over a subplot's whole height."""
    s, e = us_to_ms([selected["start_us"], selected["end_us"]]).tolist()
    lo, hi = y_range
    label = plain(selected.get("label") or SELECTED_NAME)
    return {"type": "scatter", "x": [s, s, e, e, s], "y": [lo, hi, hi, lo, lo], "mode": "lines",
            "name": SELECTED_NAME, "meta": "selected-outlier", "xaxis": axes[0], "yaxis": axes[1],
            "line": {"color": SELECTED_COLOR, "width": 2, "dash": "dot"}, "fill": "toself",
            "fillcolor": "rgba(0,0,0,0.05)", "hoverinfo": "text", "hovertext": label, "showlegend": False}


def window_figure_spec(window: Window, *, max_points: int = MAX_POINTS, title: str | None = None,
                       uirevision: str | None = None, x_range: tuple[int, int] | None = None,
                       range_revision: str | None = None, stall_us: float | None = None,
                       selected: dict | None = None, batches: BatchBars | None = None) -> dict:
    """window_figure as a plain dict (what the dashboard sends; no plotly validation cost).

    x_range: the time range shown, when the window holds a little more (the samples just
    outside, so that metric lines cross a window narrower than the sampling interval).
    uirevision keeps what the user changed (hidden series, drag mode) across updates;
    range_revision, changed with each window, makes the axes take the new window's range.
    stall_us: GetNexts longer are drawn as stalls (framework_gantt). selected: the outlier
    a user chose ({start_us, end_us, label}), outlined. batches: the selected loader's wait
    against compute, a subplot over the framework events.
    A kind of metric that holds one value throughout (I/O wait at 0 %) is one line of text
    at the top, not a subplot.
    """
    span_us = x_range or _window_span(window)
    if span_us is None:
        return empty_figure_spec("Nothing recorded in this window", height=NOTE_PX)
    lo, hi = span_us
    system, framework = window.system, window.framework
    series = []  # (group, label, x, y)
    if len(system):
        keys = ["node", "type", "name", "dimension"]
        multi_node = system["node"].nunique() > 1
        for (node, type_, name, dimension), part in system.groupby(keys, observed=True, sort=True):
            group = metric_group(str(type_), str(name), str(dimension))
            series.append((group, _series_label(str(node), str(name), str(dimension), multi_node),
                           part["timestamp_us"].to_numpy(), part["value"].to_numpy(dtype="float64")))
    flat_lines = []
    for group in sorted({s[0] for s in series}):
        value = _flat_value([s[3] for s in series if s[0] == group])
        if value is not None:
            flat_lines.append(group.flat_text(value))
            series = [s for s in series if s[0] != group]
    groups = sorted({s[0] for s in series})
    rows = gantt_rows(framework) if len(framework) else GanttRows(np.array([], dtype="int64"), [])
    has_bars = batches is not None and len(batches.start_us) > 0
    if not groups and not rows.labels and not has_bars:
        if flat_lines:
            return empty_figure_spec("<br>".join(flat_lines), height=NOTE_PX + 16 * (len(flat_lines) - 1))
        return empty_figure_spec("No system metrics or framework events in this window "
                                 "(check the time range and the two filters)", height=NOTE_PX)

    # Stack the subplots top to bottom: metric rows, the loader's batches, then the Gantt; heights in pixels.
    heights = ([METRIC_ROW_PX] * len(groups) + ([BATCH_ROW_PX] if has_bars else [])
               + ([40 + GANTT_ROW_PX * len(rows.labels)] if rows.labels else []))
    titles = ([g.title for g in groups]
              + ([f"Wait against compute per batch: {plain(batches.loader)}"] if has_bars else [])
              + (["Framework events (phase · process)"] if rows.labels else []))
    gap_px, legend_px = 34, 66  # the legend under the time axis: its ticks (two lines) and title
    top_px = 30 + 16 * len(flat_lines)
    bottom_px = legend_px + (40 if rows.labels or has_bars else 0)
    plot_px = sum(heights) + gap_px * (len(heights) - 1)
    total_px = plot_px + top_px + bottom_px
    layout = {"template": TEMPLATE, "height": total_px, "showlegend": True,
              "margin": {"l": 60, "r": 20, "t": top_px, "b": bottom_px}, "annotations": [],
              "uirevision": uirevision, "barmode": "stack", "bargap": 0}
    if title:
        layout["title"] = {"text": title}
    if flat_lines:
        layout["annotations"].append({"text": "<br>".join(flat_lines), "x": 0, "xref": "paper", "y": 1,
                                      "yref": "paper", "xanchor": "left", "yanchor": "bottom", "yshift": 20,
                                      "align": "left", "showarrow": False, "name": "flat",
                                      "font": {"size": 12, "color": "#4b5563"}})
    axes = []
    top = 1.0
    for i, (height, subtitle) in enumerate(zip(heights, titles), 1):
        bottom = top - height / plot_px
        suffix = "" if i == 1 else str(i)
        last = i == len(heights)
        # Time labels on the bottom axis only: between subplots they would collide with titles.
        layout[f"xaxis{suffix}"] = {"type": "date", "range": [lo / 1000.0, hi / 1000.0], "anchor": f"y{suffix}",
                                    "uirevision": range_revision,
                                    "showticklabels": last, "showspikes": True, "spikemode": "across",
                                    "spikethickness": 1, "spikecolor": "#9ca3af",
                                    **({"title": TIME_AXIS_TITLE} if last else {}),
                                    **({"matches": "x"} if i > 1 else {})}
        layout[f"yaxis{suffix}"] = {"domain": [max(0.0, bottom), top], "anchor": f"x{suffix}",
                                    "rangemode": "tozero", "uirevision": range_revision}
        layout["annotations"].append({"text": f"<b>{subtitle}</b>", "x": 0, "xref": "paper", "y": top,
                                      "yref": "paper", "xanchor": "left", "yanchor": "bottom",
                                      "showarrow": False, "font": {"size": 12, "color": "#374151"}})
        axes.append((f"x{suffix}", f"y{suffix}"))
        if last:  # the phase legend goes under the time axis
            layout["legend"] = {"orientation": "h", "x": 0, "xanchor": "left", "y": -legend_px / plot_px,
                                "yanchor": "top", "font": {"size": 11}}
        top = bottom - gap_px / plot_px

    data = []
    system_budget = max_points // 2 if rows.labels else max_points
    per_series = max(20, min(decimate.DEFAULT_BUCKETS, system_budget // (2 * max(1, len(series)))))
    row_of = {g: i for i, g in enumerate(groups)}
    in_row = [sum(1 for s in series if row_of[s[0]] == r) for r in range(len(groups))]
    color_index: dict[int, int] = {}
    for r, count in enumerate(in_row):
        if count <= MAX_LEGEND_ITEMS:  # each subplot its own legend, on its title line
            top_of_row = layout[f"yaxis{r + 1 if r else ''}"]["domain"][1]
            layout[f"legend{r + 2}"] = {"orientation": "h", "x": 1, "xanchor": "right", "y": top_of_row,
                                        "yanchor": "bottom", "font": {"size": 11}, "bgcolor": "rgba(0,0,0,0)"}
    for group, label, x, y in series:
        r = row_of[group]
        keep = decimate.minmax_indices(x, y, per_series, lo, hi)
        color = PALETTE[color_index.get(r, 0) % len(PALETTE)]
        color_index[r] = color_index.get(r, 0) + 1
        unit = f" {group.unit}" if group.unit else ""
        data.append({"type": "scatter", "x": typed_array(us_to_ms(x[keep])), "y": typed_array(y[keep]),
                     "mode": "lines", "name": label, "xaxis": axes[r][0], "yaxis": axes[r][1],
                     "line": {"width": 1.3, "color": color}, "legend": f"legend{r + 2}",
                     "showlegend": in_row[r] <= MAX_LEGEND_ITEMS,
                     "hovertemplate": f"{label}: %{{y:,.4~r}}{unit}<extra>{group.name}</extra>"})
    if has_bars:
        bar_axes = axes[len(groups)]
        traces, unit = batch_traces(batches, bar_axes)
        data += traces
        layout[f"yaxis{len(groups) + 1 if groups else ''}"]["title"] = {"text": unit, "standoff": 4}
    if rows.labels:
        used = sum(len(t["x"]["bdata"]) * 3 // 4 // 8 for t in data if isinstance(t.get("x"), dict))
        data += framework_gantt(framework, rows, hi - lo, max(4_000, max_points - used), axes=axes[-1],
                                stall_us=stall_us)
        layout[f"yaxis{len(heights) if len(heights) > 1 else ''}"].update(
            tickvals=list(range(len(rows.labels))), ticktext=rows.labels, showgrid=False,
            range=[len(rows.labels) - 0.5, -0.5], fixedrange=True, rangemode="normal")
    if selected:
        if rows.labels:
            data.append(selected_mark(selected, axes[-1], (-0.5, len(rows.labels) - 0.5)))
        else:
            s, e = us_to_ms([selected["start_us"], selected["end_us"]]).tolist()
            layout["shapes"] = [{"type": "rect", "xref": "x", "yref": "paper", "x0": s, "x1": e, "y0": 0, "y1": 1,
                                 "line": {"color": SELECTED_COLOR, "width": 2, "dash": "dot"},
                                 "fillcolor": "rgba(0,0,0,0.05)", "name": SELECTED_NAME}]
    return {"data": data, "layout": layout}


def window_figure(window: Window, *, max_points: int = MAX_POINTS, title: str | None = None) -> go.Figure:
    """The detail timeline of a window: one subplot per system metric dimension (CPU per
    core, I/O wait, GPU, GPU memory, memory, I/O, network), then the framework events as a
    Gantt by phase and process. X axes are shared and span exactly the window.
    """
    return go.Figure(window_figure_spec(window, max_points=max_points, title=title))


# --- the overview of the whole job -----------------------------------------------------------

@dataclass
class OverviewSeries:
    """What the overview draws, computed once per trial and node."""
    start_us: int
    end_us: int
    cpu_x: np.ndarray  # epoch us
    cpu_y: np.ndarray  # mean CPU utilization over cores and nodes, %
    gpu_x: np.ndarray
    gpu_y: np.ndarray
    getnext_x: np.ndarray  # GetNext starts, epoch us, sorted
    getnext_y: np.ndarray  # durations, ms


def _mean_over_time(system: pd.DataFrame, dimension: str) -> tuple[np.ndarray, np.ndarray]:
    part = system[system["dimension"] == dimension] if len(system) else system
    if part.empty:
        return np.array([], dtype="int64"), np.array([], dtype="float64")
    means = part.groupby("timestamp_us", sort=True)["value"].mean()
    return means.index.to_numpy(), means.to_numpy()


def overview_series(system: pd.DataFrame, getnext: pd.DataFrame, start_us: int, end_us: int) -> OverviewSeries:
    cpu_x, cpu_y = _mean_over_time(system, "CPUUtilization")
    gpu_x, gpu_y = _mean_over_time(system, "GPUUtilization")
    order = np.argsort(getnext["start_us"].to_numpy(), kind="stable")
    return OverviewSeries(int(start_us), int(end_us), cpu_x, cpu_y, gpu_x, gpu_y,
                          getnext["start_us"].to_numpy()[order],
                          getnext["duration_us"].to_numpy().astype("float64")[order] / 1000.0)


def overview_figure_spec(series: OverviewSeries, window: tuple[int, int] | None = None,
                         uirevision: str = "overview", buckets: int = decimate.DEFAULT_BUCKETS,
                         range_revision: str | None = None, stall_us: float | None = None, selected: dict | None = None) -> dict:
    """The whole job, always: mean CPU (and GPU) utilization and GetNext durations over time,
    the GetNext stalls (over `stall_us`) as marks that no reduction drops (peaks_over), the
    window as a shaded band and the selected outlier as a line. Its x axis never zooms
    (fixedrange): a drag across it (a box select) chooses the window, and the band moves.
    uirevision keeps the user's hidden series; range_revision, changed with each window,
    puts the axis back on the whole job should anything have moved it.
    """
    span = (series.start_us, series.end_us)
    data = []
    for x, y, name, color, fill in ((series.cpu_x, series.cpu_y, "CPU % (mean)", "#999999", "tozeroy"),
                                    (series.gpu_x, series.gpu_y, "GPU % (mean)", PHASE_COLORS[fmt.PHASE_WORKER],
                                     "none")):
        if len(x):
            keep = decimate.minmax_indices(x, y, buckets, *span)
            data.append({"type": "scatter", "x": typed_array(us_to_ms(x[keep])), "y": typed_array(y[keep]),
                         "name": name, "mode": "lines", "line": {"width": 1, "color": color}, "fill": fill,
                         "fillcolor": "rgba(153,153,153,0.2)",
                         "hovertemplate": "%{y:.1f} %<extra>" + name + "</extra>"})
    getnext_us = series.getnext_y * 1000.0
    if len(series.getnext_x):
        keep = decimate.minmax_indices(series.getnext_x, series.getnext_y, buckets, *span)
        data.append({"type": "scatter", "x": typed_array(us_to_ms(series.getnext_x[keep])),
                     "y": typed_array(series.getnext_y[keep]), "name": "GetNext", "mode": "markers",
                     "yaxis": "y2", "marker": {"size": 4, "color": PHASE_COLORS[fmt.PHASE_ITER], "opacity": 0.6},
                     "hovertext": [f"GetNext {t}" for t in durations_us(getnext_us[keep])], "hoverinfo": "text"})
        if stall_us is not None:
            stalls = decimate.peaks_over(series.getnext_x, getnext_us, stall_us, buckets, *span)
            if len(stalls):
                data.append({"type": "scatter", "x": typed_array(us_to_ms(series.getnext_x[stalls])),
                             "y": typed_array(series.getnext_y[stalls]), "name": stall_label(stall_us),
                             "mode": "markers", "yaxis": "y2", "meta": "stall-marks",
                             "marker": {"size": 9, "symbol": "triangle-down", "color": OUTLIER_COLOR,
                                        "line": {"width": 0.5, "color": "white"}},
                             "hovertext": [f"{STALL_NAME} {t}" for t in durations_us(getnext_us[stalls])],
                             "hoverinfo": "text"})
    if not data:
        return empty_figure_spec("No events or metrics in this trial", height=NOTE_PX)
    shapes = []
    if window is not None and tuple(window) != span:
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": window[0] / 1000.0,
                       "x1": window[1] / 1000.0, "y0": 0, "y1": 1, "layer": "below", "name": "window",
                       "fillcolor": "rgba(0,114,178,0.12)", "line": {"color": PHASE_COLORS[fmt.PHASE_ITER], "width": 1}})
    if selected:  # its span, outlined: at least a line at this zoom, over its stall mark
        data.append(selected_mark(selected, ("x", "y"), (0, 105)))
    largest = float(series.getnext_y.max()) if len(series.getnext_y) else 1.0
    layout = {
        "template": TEMPLATE, "height": 260, "margin": {"l": 60, "r": 60, "t": 30, "b": 56},
        "xaxis": {"type": "date", "range": [span[0] / 1000.0, span[1] / 1000.0], "fixedrange": True,
                  "title": TIME_AXIS_TITLE,
                  "uirevision": range_revision},
        "yaxis": {"title": {"text": "utilization (%)"}, "fixedrange": True, "range": [0, 105]},
        "yaxis2": {"title": {"text": "GetNext (ms, log scale)"}, "type": "log", "overlaying": "y", "side": "right",
                   "dtick": 1, "fixedrange": True, "showgrid": False,
                   "range": [np.log10(max(float(series.getnext_y.min()) if len(series.getnext_y) else 0.01, 1e-3)) - 0.2,
                             np.log10(max(largest, 1e-3)) + 0.3]},
        "shapes": shapes, "dragmode": "select", "selectdirection": "h", "uirevision": uirevision,
        # A finished box select is drawn as the band: plotly's own outline of it goes.
        "selections": []}
    return {"data": data, "layout": layout}


# --- the four panels -------------------------------------------------------------------------



def _duration_axis(values_us) -> tuple:
    """(unit, values in it) of a duration axis: the unit its largest value is written in."""
    values = np.asarray(values_us, dtype="float64")
    unit = axis_unit(float(np.nanmax(values)) if len(values) and not np.isnan(values).all() else 0.0)
    return unit, values / unit.us


def _panel_spec(data: list[dict], height: int, xaxis: dict, yaxis: dict, **extra) -> dict:
    """A panel's figure as a plain dict, as the window's (no plotly validation cost)."""
    return {"data": data, "layout": {"template": TEMPLATE, "height": height, "xaxis": xaxis, "yaxis": yaxis,
                                     **extra}}


def _time_axis() -> dict:
    return {"type": "date", "title": TIME_AXIS_TITLE}


def initialization_figure_spec(init: InitializationResult) -> dict:
    """Iterator initializations over time, one colour per iterator class."""
    events = init.events
    if events.empty:
        return empty_figure_spec("No DataLoader iterator initializations recorded", NOTE_PX)
    unit, _ = _duration_axis(events["duration_us"])
    data = []
    for i, (cls, part) in enumerate(events.groupby("type", sort=True)):
        x, y_us = part["start_us"].to_numpy(), part["duration_us"].to_numpy(dtype="float64")
        keep = decimate.minmax_indices(x, y_us)
        # The legend has a short name (a half-width panel); the hover the whole class.
        data.append({"type": "scatter", "x": typed_array(us_to_ms(x[keep])), "y": typed_array(y_us[keep] / unit.us),
                     "mode": "markers", "name": plain(short_name(cls)),
                     "marker": {"size": 8, "color": PALETTE[i % len(PALETTE)]},
                     "hovertext": [f"{plain(cls)}<br>{t}" for t in durations_us(y_us[keep])], "hoverinfo": "text"})
    data += _outlier_markers(init.outliers, "duration_us", unit.us)
    return _panel_spec(data, 280, _time_axis(),
                       {"title": {"text": f"initialization ({unit.name}, log scale)"}, "type": "log", "dtick": 1})


def _outlier_markers(outliers: pd.DataFrame, column: str, scale: float, limit: int = 5_000) -> list[dict]:
    if outliers.empty:
        return []
    part = outliers.head(limit)  # longest first
    return [{"type": "scatter", "x": typed_array(us_to_ms(part["start_us"].to_numpy())),
             "y": typed_array(part[column].to_numpy(dtype="float64") / scale), "mode": "markers", "name": "outlier",
             "marker": {"size": 11, "color": "rgba(0,0,0,0)", "line": {"color": OUTLIER_COLOR, "width": 2}},
             "hoverinfo": "skip"}]


def workers_figure_spec(workers: DurationStats) -> dict:
    """Worker process lifetimes as a Gantt, one row per node and process."""
    events = workers.events
    if events.empty:
        return empty_figure_spec("No DataLoader worker processes recorded (single-process loaders)", NOTE_PX)
    frame = events.assign(phase=fmt.PHASE_WORKER)
    rows = gantt_rows(frame, max_rows=60)
    span = int(events["end_us"].max() - events["start_us"].min())
    outlier = np.zeros(len(events), dtype="int8")
    if not workers.outliers.empty:
        key = pd.MultiIndex.from_frame(workers.outliers[["start_us", "end_us", "pid"]].astype("float64"))
        mine = pd.MultiIndex.from_frame(events[["start_us", "end_us", "pid"]].astype("float64"))
        outlier = mine.isin(key).astype("int8")
    data = _gantt_traces(events["start_us"].to_numpy(), events["end_us"].to_numpy(), rows.row,
                         outlier, ["worker", "outlier"], [PHASE_COLORS[fmt.PHASE_WORKER], OUTLIER_COLOR],
                         _event_hover(events), gap_us=max(span, 1) / decimate.DEFAULT_BUCKETS, line_px=10)
    yaxis = {"tickvals": list(range(len(rows.labels))),
             "ticktext": [label.replace(f"{fmt.PHASE_WORKER} · ", "") for label in rows.labels],
             "range": [len(rows.labels) - 0.5, -0.5], "showgrid": False, "automargin": True}
    return _panel_spec(data, min(900, 90 + 20 * len(rows.labels)), _time_axis(), yaxis)


def getnext_histogram_spec(getnext: DurationStats, outlier_factor: float) -> dict:
    """How long GetNext takes: counts in log-spaced duration bins."""
    durations = getnext.events["duration_us"].to_numpy()
    if len(durations) == 0:
        return empty_figure_spec("No GetNext calls recorded", NOTE_PX)
    edges, counts = decimate.log_histogram(durations)
    unit, scaled = _duration_axis(edges)
    texts = [f"{lo}–{hi}: {n:,} calls" for lo, hi, n in zip(durations_us(edges[:-1]), durations_us(edges[1:]),
                                                             counts.tolist())]
    data = [{"type": "bar", "x": ((scaled[:-1] + scaled[1:]) / 2).tolist(), "y": counts.tolist(),
             "width": np.diff(scaled).tolist(), "name": "calls",
             "marker": {"color": PHASE_COLORS[fmt.PHASE_ITER], "line": {"width": 0}},
             "hovertext": texts, "hoverinfo": "text"}]
    if getnext.median_us:
        top = float(counts.max()) * 1.05
        for value, label, dash in ((getnext.median_us, "median", "solid"),
                                   (getnext.median_us * outlier_factor, f"outlier threshold ({outlier_factor:g}× median)",
                                    "dot")):
            data.append({"type": "scatter", "x": [value / unit.us] * 2, "y": [0, top], "mode": "lines", "name": label,
                         "line": {"color": OUTLIER_COLOR if dash == "dot" else "#111827", "dash": dash, "width": 1.5},
                         "hovertemplate": f"{label}: {duration_us(value)}<extra></extra>"})
    return _panel_spec(data, 280, {"type": "log", "dtick": 1,
                                   "title": {"text": f"GetNext duration ({unit.name}, log scale)"}},
                       {"title": {"text": "calls"}}, bargap=0)


def getnext_timeline_spec(getnext: DurationStats, outlier_factor: float) -> dict:
    """GetNext durations over time, one colour per worker id."""
    events = getnext.events
    if events.empty:
        return empty_figure_spec("No GetNext calls recorded", NOTE_PX)
    workers = events["worker_id"].astype("float64").fillna(-2).to_numpy()
    x_all, y_all = events["start_us"].to_numpy(), events["duration_us"].to_numpy(dtype="float64")
    unit, _ = _duration_axis(y_all)
    values = np.unique(workers)
    buckets = max(100, min(decimate.DEFAULT_BUCKETS, MAX_POINTS // (2 * len(values))))
    data = []
    for i, worker in enumerate(values):
        mask = workers == worker
        x, y = x_all[mask], y_all[mask]
        keep = decimate.minmax_indices(x, y, buckets)
        label = worker_text(None if worker == -2 else worker)
        data.append({"type": "scattergl", "x": typed_array(us_to_ms(x[keep])), "y": typed_array(y[keep] / unit.us),
                     "mode": "markers", "name": label, "marker": {"size": 4, "color": PALETTE[i % len(PALETTE)]},
                     "hovertext": durations_us(y[keep]), "hoverinfo": "text+name"})
    if getnext.median_us:
        threshold = getnext.median_us * outlier_factor
        data.append(_level(x_all, threshold / unit.us,
                           f"outlier threshold ({outlier_factor:g}× median, {duration_us(threshold)})",
                           OUTLIER_COLOR, "dot"))
    return _panel_spec(data, 280, _time_axis(),
                       {"type": "log", "dtick": 1, "title": {"text": f"GetNext ({unit.name}, log scale)"}})


def _level(x_us: np.ndarray, level: float, label: str, color: str, dash: str) -> dict:
    """A horizontal reference line across the data, as a trace (it works on log axes too)."""
    return {"type": "scatter", "x": us_to_ms([x_us.min(), x_us.max()]).tolist(), "y": [level, level],
            "mode": "lines", "name": label, "line": {"color": color, "dash": dash, "width": 1.5},
            "hovertemplate": f"{label}<extra></extra>"}


def batchtime_figure_spec(batch: BatchTimeResult) -> dict:
    """BatchTime over time with its median; outliers ringed."""
    batches = batch.batches
    if batches.empty:
        return empty_figure_spec("No batch times (fewer than two GetNext calls per iterator)", NOTE_PX)
    x, y_us = batches["start_us"].to_numpy(), batches["batch_time_s"].to_numpy().astype("float64") * 1e6
    unit, _ = _duration_axis(y_us)
    keep = decimate.minmax_indices(x, y_us)
    data = [{"type": "scattergl", "x": typed_array(us_to_ms(x[keep])), "y": typed_array(y_us[keep] / unit.us),
             "mode": "lines+markers", "name": "batch time", "line": {"width": 1, "color": PHASE_COLORS[fmt.PHASE_ITER]},
             "marker": {"size": 3}, "hovertext": durations_us(y_us[keep]), "hoverinfo": "text"}]
    if not batch.outliers.empty:
        part = batch.outliers.head(5_000)
        out_us = part["batch_time_s"].to_numpy(dtype="float64") * 1e6
        data.append({"type": "scattergl", "x": typed_array(us_to_ms(part["start_us"].to_numpy())),
                     "y": typed_array(out_us / unit.us), "mode": "markers", "name": "outlier",
                     "marker": {"size": 9, "color": OUTLIER_COLOR, "symbol": "circle-open", "line": {"width": 2}},
                     "hovertext": [f"outlier {t}" for t in durations_us(out_us)], "hoverinfo": "text"})
    if batch.median_s is not None:
        data.append(_level(x, batch.median_s * 1e6 / unit.us, f"median {duration_s(batch.median_s)}", "#111827",
                           "solid"))
    return _panel_spec(data, 280, _time_axis(), {"title": {"text": f"batch time ({unit.name})"}, "rangemode": "tozero"})


# --- the wait budget and the what-if ------------------------------------------------------------

# One colour per part of the wait, the same wherever a part is drawn: the Okabe-Ito palette,
# which readers with any common colour-vision deficiency tell apart. "residual" (what the
# model does not explain) is a hatched grey: shown, never hidden, and not mistaken for a cause.
PART_COLORS = {"startup": "#E69F00", "throughput": "#0072B2", "imbalance": "#CC79A7", "tail": "#D55E00",
               "main_process": "#009E73", "contention": "#F0E442", "residual": "#8C8C8C"}
PART_PATTERNS = {"residual": "/"}
NOT_WAITING = "not waiting (computing)"
NOT_WAITING_COLOR = "#E5E7EB"
WAIT_NOW_COLOR = "#4B5563"
WAIT_PREDICTED_COLOR = "#56B4E9"  # Okabe-Ito sky blue: no part of the budget uses it
BUDGET_ROW_PX = 46
BUDGET_COMPACT_ROW_PX = 34  # with many loaders
BAR_TEXT_MIN_SHARE = 0.07  # a segment this share of its bar, or more, carries its seconds
WHAT_IF_LEFT_PX = 70
CLICK_HINT = "<br><i>click: show its longest wait on the timeline</i>"


def _bar_text_color(hex_color: str) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return "#111827" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "white"


def budget_key(part_names: dict) -> list[tuple[str, str, str]]:
    """The budget's key: (part or "not_waiting", its words, its CSS background), in the bars' order."""
    out = []
    for part, color in PART_COLORS.items():
        if part in PART_PATTERNS:  # the hatch, as CSS draws it
            color = f"repeating-linear-gradient(135deg, {color} 0 3px, #ffffff 3px 5px)"
        name = part_names.get(part, part)
        out.append((part, f"{name} (residual)" if part == "residual" else name, color))
    out.append(("not_waiting", NOT_WAITING, NOT_WAITING_COLOR))
    return out


def budget_figure_spec(rows: list[dict], part_names: dict) -> dict:
    """One horizontal bar per training loader: its training time, the waiting in it split
    into the budget's parts (seconds; hover adds the share of training), the rest not
    waiting. A click on a part names that part's window in the point's customdata
    (start_us, end_us at [2] and [3]; null for a part without one).

    rows: views.budget_rows(); part_names: the parts' words (report.PART_WORDS)."""
    if not rows:
        return empty_figure_spec("No training loader: nothing to split", height=110)
    n = len(rows)
    row_px = BUDGET_ROW_PX if n <= 6 else BUDGET_COMPACT_ROW_PX
    y = list(range(n))
    data = []
    for part in list(PART_COLORS) + [None]:
        name = plain(part_names.get(part, part)) if part else NOT_WAITING
        color = PART_COLORS[part] if part else NOT_WAITING_COLOR
        x, custom, text = [], [], []
        for row in rows:
            training = row["training_s"]
            seconds = row["parts"][part] if part else max(training - row["wait_s"], 0.0)
            window = row["windows"].get(part) if part else None
            share = seconds / training if training > 0 else 0.0
            x.append(seconds)
            custom.append([seconds, 100.0 * share, window["start_us"] if window else None,
                           window["end_us"] if window else None, CLICK_HINT if window else "",
                           plain(row["label"]), duration_s(seconds)])
            text.append(duration_s(seconds) if part and share >= BAR_TEXT_MIN_SHARE else "")
        label = f"{name} (residual)" if part == "residual" else name
        data.append({
            "type": "bar", "orientation": "h", "x": x, "y": y, "name": label, "width": 0.5,
            "customdata": custom, "text": text, "textposition": "inside", "insidetextanchor": "middle",
            "textfont": {"color": _bar_text_color(color), "size": 11}, "cliponaxis": False,
            "marker": {"color": color, "line": {"width": 0.5 if part else 1, "color": "white" if part else "#D1D5DB"},
                       **({"pattern": {"shape": PART_PATTERNS[part], "fgcolor": "#FFFFFF", "size": 6}}
                          if part in PART_PATTERNS else {})},
            "meta": part or "not_waiting",
            "hovertemplate": "%{customdata[5]}<br><b>" + label + "</b>: %{customdata[6]}, "
                             "%{customdata[1]:.1f} % of training time%{customdata[4]}<extra></extra>",
        })
    annotations = []
    for i, row in enumerate(rows):
        training, wait = row["training_s"], row["wait_s"]
        share = 100.0 * wait / training if training > 0 else 0.0
        residual = row["parts"]["residual"]
        annotations += [
            {"text": f"<b>{plain(row['loader'])}</b> on {plain(row['node'])}", "x": 0, "xref": "paper",
             "xanchor": "left", "y": i - 0.27, "yanchor": "bottom", "showarrow": False,
             "font": {"size": 12, "color": "#1f2937"}},
            {"text": f"waits {duration_s(wait)} of {duration_s(training)} (<b>{share:.1f} %</b>)"
                     f" · unexplained {duration_s(residual)}",
             "x": 1, "xref": "paper", "xanchor": "right", "y": i - 0.27, "yanchor": "bottom", "showarrow": False,
             "font": {"size": 11, "color": "#4b5563"}}]
    # The key is the page's (budget_key): it wraps where the block is narrow, a plotly legend does not.
    top, axis_px = 4, 26
    layout = {
        "template": TEMPLATE, "height": top + int(row_px * (n + 0.32)) + axis_px, "barmode": "relative",
        "bargap": 0, "margin": {"l": 8, "r": 8, "t": top, "b": axis_px}, "hovermode": "closest",
        "dragmode": False, "showlegend": False, "annotations": annotations, "hoverlabel": {"align": "left"},
        "uniformtext": {"minsize": 9, "mode": "hide"},
        "xaxis": {"rangemode": "tozero", "fixedrange": True, "ticksuffix": " s", "automargin": False},
        "yaxis": {"range": [n - 0.5, -0.82], "visible": False, "fixedrange": True},
    }
    return {"data": data, "layout": layout}


def what_if_figure_spec(rows: list[dict]) -> dict:
    """Per loader, today's bar and the predicted one: the training time, the waiting in it
    (seconds; the share of training as text and on hover).

    rows: views.what_if_view()["rows"]: label, now {wait_s, training_s, wait_fraction},
    predicted (the same, or None) and note."""
    if not rows:
        return empty_figure_spec("No training loader to predict", height=110)
    y, wait, rest, colors, custom, texts, ticks = [], [], [], [], [], [], []
    annotations = []
    widest = max(max(r["now"]["training_s"], (r["predicted"] or {}).get("training_s", 0.0)) for r in rows)
    for i, row in enumerate(rows):
        base = 3 * i
        # The loader's name from the figure's left edge (over the tick labels' margin).
        annotations.append({"text": plain(row["label"]), "x": 0, "xref": "paper", "xanchor": "left",
                            "xshift": -WHAT_IF_LEFT_PX + 4, "y": base - 0.62, "yanchor": "bottom",
                            "showarrow": False, "font": {"size": 11, "color": "#1f2937"}})
        for offset, name, values, color in ((0, "today", row["now"], WAIT_NOW_COLOR),
                                            (1, "predicted", row["predicted"], WAIT_PREDICTED_COLOR)):
            ticks.append((base + offset, name))
            if values is None:
                if offset == 1:
                    # The reason is in the lines under the figure, where it can wrap.
                    annotations.append({"text": "no prediction for this loader", "x": 0, "xref": "x",
                                        "xanchor": "left", "y": base + offset, "showarrow": False,
                                        "font": {"size": 11, "color": "#6b7280"}})
                continue
            training = values["training_s"]
            seconds = values["wait_s"]
            percent = 100.0 * values["wait_fraction"]
            y.append(base + offset)
            wait.append(seconds)
            rest.append(max(training - seconds, 0.0))
            colors.append(color)
            custom.append([seconds, percent, training, name, plain(row["label"]), duration_s(seconds),
                           duration_s(training)])
            texts.append(f"{percent:.1f} % · {duration_s(training)}")
    hover = ("%{customdata[4]}<br><b>%{customdata[3]}</b>: waits %{customdata[5]}, "
             "%{customdata[1]:.1f} % of %{customdata[6]} of training<extra></extra>")
    data = [
        {"type": "bar", "orientation": "h", "x": wait, "y": y, "name": "waiting for data", "width": 0.72,
         "marker": {"color": colors, "line": {"width": 0}}, "customdata": custom, "hovertemplate": hover,
         "meta": "wait"},
        {"type": "bar", "orientation": "h", "x": rest, "y": y, "name": NOT_WAITING, "width": 0.72,
         "marker": {"color": NOT_WAITING_COLOR, "line": {"width": 1, "color": "#D1D5DB"}}, "customdata": custom,
         "hovertemplate": hover, "text": texts, "textposition": "outside", "cliponaxis": False,
         "textfont": {"size": 11, "color": "#1f2937"}, "meta": "rest"},
    ]
    n_ticks = 3 * len(rows) - 1
    layout = {
        "template": TEMPLATE, "height": 44 + 18 * (n_ticks + 1) + 10 * len(rows), "barmode": "stack",
        "bargap": 0, "showlegend": False, "dragmode": False, "hovermode": "closest", "hoverlabel": {"align": "left"},
        "margin": {"l": WHAT_IF_LEFT_PX, "r": 12, "t": 8, "b": 34}, "annotations": annotations,
        "xaxis": {"range": [0, widest * 1.38 if widest > 0 else 1], "fixedrange": True, "ticksuffix": " s",
                  "title": {"text": "training time; filled: waiting for data", "font": {"size": 11},
                            "standoff": 2}},
        "yaxis": {"range": [n_ticks + 0.5, -1.05], "tickvals": [t[0] for t in ticks],
                  "ticktext": [t[1] for t in ticks], "fixedrange": True, "showgrid": False},
    }
    return {"data": data, "layout": layout}


# --- two runs compared ------------------------------------------------------------------------

# The two runs of a comparison, wherever they are drawn: A (before) grey-blue, B (after) orange
# (Okabe-Ito: told apart with any common colour-vision deficiency).
RUN_COLORS = {"A": PALETTE[0], "B": PALETTE[1]}


def overlaid_distributions_spec(series: dict, title: str) -> dict:
    """Histograms of two runs' durations (microseconds) on shared log-spaced bins, drawn
    over one another as outlines: series maps a run's label ("A", "B") to its values. Each
    run's counts are its share of its own calls, so runs of different lengths compare."""
    values = {label: np.asarray(v, dtype="float64") for label, v in series.items()}
    values = {label: v[np.isfinite(v)] for label, v in values.items()}
    present = [v for v in values.values() if len(v)]
    if not present:
        return empty_figure_spec(f"No {title} recorded", height=260)
    edges, _ = decimate.log_histogram(np.concatenate(present))
    unit = axis_unit(float(edges[-1]))
    data = []
    for label, v in values.items():
        if not len(v):
            continue
        counts, _ = np.histogram(np.clip(v, edges[0], edges[-1]), bins=edges)
        share = 100.0 * counts / len(v)
        # A step outline ("hv"): each bin from its left edge to the next, the last to the end.
        x, y = edges / unit.us, np.append(share, share[-1])
        color = RUN_COLORS.get(label, PALETTE[len(data) % len(PALETTE)])
        data.append({"type": "scatter", "mode": "lines", "x": x.tolist(), "y": y.tolist(), "name": plain(label),
                     "line": {"color": color, "width": 2, "shape": "hv"}, "fill": "tozeroy",
                     "fillcolor": color + "33", "meta": label,
                     "hovertemplate": f"{plain(label)}: %{{y:.1f}} % of calls at %{{x:.4g}} {unit.name}"
                                      "<extra></extra>"})
    layout = {"template": TEMPLATE, "height": 260, "margin": {"l": 60, "r": 20, "t": 30, "b": 40},
              "xaxis": {"type": "log", "title": {"text": f"{title} ({unit.name}, log scale)"}},
              "yaxis": {"title": {"text": "% of calls"}, "rangemode": "tozero"}}
    return {"data": data, "layout": layout}


RANK_ROW_PX = 16


def rank_heatmap_spec(heat, window: tuple[int, int] | None = None) -> dict:
    """Data waiting by rank over time (analysis.ranks.Heatmap): one row per process (y: its
    id, labelled with its host and rank), one column per time bucket, the colour the share of
    the bucket spent in GetNext. A click gives the row's process id and the column's middle."""
    if not heat.processes:
        return empty_figure_spec("no GetNext events", height=160)
    edges = heat.edges_us
    middles = us_to_ms((edges[:-1] + edges[1:]) / 2).tolist()
    ids = [p.id for p in heat.processes]
    labels = [plain(text) for text in heat.labels]
    totals = [f"{100 * t:.0f} %" for t in heat.total]
    data = [{"type": "heatmap", "x": middles, "y": ids,
             "z": (100 * heat.share).round(1).tolist(), "zmin": 0, "zmax": 100, "colorscale": "Cividis",
             "colorbar": {"title": {"text": "waiting, %"}, "thickness": 12},
             "text": [[f"{labels[i]} (whole job {totals[i]})"] * len(middles) for i in range(len(labels))],
             "hovertemplate": "%{text}<br>%{x}<br>waiting %{z:.1f} % of the column<extra></extra>",
             "xgap": 0, "ygap": 1}]
    shapes = []
    if window is not None:
        s, e = us_to_ms(list(window)).tolist()
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": s, "x1": e, "y0": 0, "y1": 1,
                       "line": {"color": "#D55E00", "width": 2}, "fillcolor": "rgba(0,0,0,0)"})
    height = int(min(900, max(180, 70 + RANK_ROW_PX * len(labels))))
    return {"data": data, "layout": {
        "template": TEMPLATE, "height": height, "shapes": shapes,
        "margin": {"l": 10, "r": 10, "t": 10, "b": 40},
        "xaxis": {"type": "date", "title": {"text": "time (UTC)"}},
        "yaxis": {"type": "category", "tickmode": "array", "tickvals": ids, "ticktext": labels,
                  "autorange": "reversed", "title": {"text": ""}}}}
