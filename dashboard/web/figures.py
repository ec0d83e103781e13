"""Plotly figures from analysis results. No Dash here: the compatibility API's
`plot_the_window` draws `window_figure` too.

Times are drawn on date axes as float epoch milliseconds (plotly reads numbers on a date
axis as ms since the epoch, UTC), which travel to the browser as compact binary arrays.
No figure sends more than about MAX_POINTS points: long series are reduced to the
min and max of each pixel bucket, and Gantt bars that would overlap on screen are merged.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import format as fmt
from ..analysis import decimate
from ..analysis.dataloader import BatchTimeResult, DurationStats, InitializationResult, Window

MAX_POINTS = 50_000
OVERVIEW_COARSE_BUCKETS = 600
FONT = "Inter, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
PALETTE = ["#2563eb", "#f97316", "#16a34a", "#9333ea", "#0891b2", "#db2777", "#ca8a04", "#4b5563",
           "#dc2626", "#65a30d", "#7c3aed", "#0d9488"]
OUTLIER_COLOR = "#dc2626"
PHASE_COLORS = {
    fmt.PHASE_INIT: "#9333ea",
    fmt.PHASE_ITER: "#2563eb",
    fmt.PHASE_WORKER: "#16a34a",
    fmt.PHASE_WORKER_FETCH: "#0d9488",
    fmt.PHASE_STEP_TRAIN: "#f97316",
    fmt.PHASE_STEP_EVAL: "#ca8a04",
}
PHASE_ORDER = [fmt.PHASE_INIT, fmt.PHASE_ITER, fmt.PHASE_WORKER, fmt.PHASE_WORKER_FETCH,
               fmt.PHASE_STEP_TRAIN, fmt.PHASE_STEP_EVAL]
MAX_GANTT_ROWS = 40
METRIC_ROW_PX = 120
GANTT_ROW_PX = 22


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


def _layout(fig: go.Figure, height: int, **extra) -> go.Figure:
    fig.update_layout(template=TEMPLATE, height=height, **extra)
    return fig


def empty_figure(message: str, height: int = 260) -> go.Figure:
    """A blank figure with a message in the middle."""
    return go.Figure(empty_figure_spec(message, height))


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
                f"{c} {name} events merged at this zoom<br>{(be - bs) / 1000:,.3f} ms span")
            texts += [text, text, text, ""]
        traces.append({"type": "scatter", "x": typed_array(x), "y": typed_array(y), "mode": "lines",
                       "name": name, "legendgroup": f"gantt-{name}", "xaxis": axes[0], "yaxis": axes[1],
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
            text = f"{name}<br>{dur:,} us<br>pid {'?' if pid is pd.NA else pid}"
            if worker is not pd.NA:
                text += f", worker {worker}"
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


def _int_or(values: pd.Series, default: int) -> np.ndarray:
    return values.astype("Int64").fillna(default).to_numpy(dtype="int64")


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
    pids, workers = _int_or(frame["pid"], -1), _int_or(frame["worker_id"], -1)
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
        labels.append(f"{host} · {label}" if multi_host else label)
    return GanttRows(rank[codes], labels)


def _add_framework_gantt(fig: go.Figure, frame: pd.DataFrame, rows: GanttRows, span_us: float,
                         budget: int, row: int | None = None) -> None:
    phase_codes, phase_names = _category_codes(frame["phase"])
    present = sorted({phase_names[c] if c >= 0 else "?" for c in np.unique(phase_codes).tolist()},
                     key=_phase_rank)
    colors = {p: PHASE_COLORS.get(p, PALETTE[(i + 7) % len(PALETTE)]) for i, p in enumerate(present)}
    color_of_code = np.array([present.index(p) if p in present else -1 for p in phase_names]
                             + [present.index("?") if "?" in present else -1])
    n_rows = max(1, len(rows.labels))
    bars_per_row = int(np.clip(budget / 4 / n_rows, 100, decimate.DEFAULT_BUCKETS))
    _gantt_traces(fig, frame["start_us"].to_numpy(), frame["end_us"].to_numpy(), rows.row,
                  color_of_code[phase_codes], present, [colors[p] for p in present], _event_hover(frame),
                  gap_us=max(span_us, 1) / bars_per_row, row=row)


# --- the window: system metrics and framework events ----------------------------------------

_METRIC_GROUPS = [  # (type, dimension or name test, title)
    ("cpu", "CPUUtilization", "CPU utilization % (per core)"),
    ("cpu", "I/OWaitPercentage", "I/O wait %"),
    ("gpu", "GPUUtilization", "GPU utilization %"),
    ("gpu", "GPUMemoryUtilization", "GPU memory utilization %"),
    ("memory", None, "Memory used %"),
    ("i/o", "IOPS", "I/O operations per second"),
    ("i/o", None, "I/O throughput (bytes/s)"),
    ("network", None, "Network (bytes/s)"),
]


def metric_group(type_: str, name: str, dimension: str) -> tuple[int, str]:
    """(order, subplot title) of a system metric."""
    for order, (group_type, key, title) in enumerate(_METRIC_GROUPS):
        if type_ == group_type and (key is None or key in (dimension, name)):
            return order, title
    return len(_METRIC_GROUPS), f"{type_} {dimension or name}".strip()


def _series_label(node: str, name: str, dimension: str, title: str, multi_node: bool) -> str:
    label = name if not dimension or dimension in title.replace(" ", "") else f"{name} ({dimension})"
    if title.startswith("I/O wait"):
        label = name
    return f"{node} {label}" if multi_node else label


def window_figure(window: Window, *, max_points: int = MAX_POINTS, title: str | None = None) -> go.Figure:
    """The detail timeline of a window: one subplot per system metric dimension (CPU per
    core, I/O wait, GPU, GPU memory, memory, I/O, network), then the framework events as a
    Gantt by phase and process. X axes are shared and span exactly the window.
    """
    system, framework = window.system, window.framework
    lo, hi = window.start_us, window.end_us
    if not lo and not hi:  # an unbounded window: the data's own span
        times = [v for v in (system["timestamp_us"].min() if len(system) else None,
                             framework["start_us"].min() if len(framework) else None) if v is not None]
        ends = [v for v in (system["timestamp_us"].max() if len(system) else None,
                            framework["end_us"].max() if len(framework) else None) if v is not None]
        if not times:
            return empty_figure("Nothing recorded in this window")
        lo, hi = int(min(times)), int(max(ends))
    span = max(hi - lo, 1)

    series = []  # (order, title, label, x, y)
    if len(system):
        keys = ["node", "type", "name", "dimension"]
        multi_node = system["node"].nunique() > 1
        for (node, type_, name, dimension), part in system.groupby(keys, observed=True, sort=True):
            order, group_title = metric_group(str(type_), str(name), str(dimension))
            series.append((order, group_title, _series_label(str(node), str(name), str(dimension),
                                                             group_title, multi_node),
                           part["timestamp_us"].to_numpy(), part["value"].to_numpy()))
    groups = sorted({(s[0], s[1]) for s in series})
    rows = gantt_rows(framework) if len(framework) else GanttRows(np.array([], dtype="int64"), [])
    if not groups and not rows.labels:
        return empty_figure("No system metrics or framework events in this window "
                            "(check the time range and the two filters)")

    gantt_px = 40 + GANTT_ROW_PX * len(rows.labels) if rows.labels else 0
    heights = [METRIC_ROW_PX] * len(groups) + ([gantt_px] if gantt_px else [])
    total = sum(heights) + 40 * len(heights) + 60
    titles = [g[1] for g in groups] + (["Framework events (phase · process)"] if gantt_px else [])
    fig = make_subplots(rows=len(heights), cols=1, shared_xaxes=True, row_heights=heights,
                        vertical_spacing=min(40 / total, 1 / max(1, len(heights) - 1) * 0.9),
                        subplot_titles=titles)
    system_budget = max_points // 2 if rows.labels else max_points
    per_series = max(20, min(decimate.DEFAULT_BUCKETS, system_budget // (2 * max(1, len(series)))))
    row_of = {g: i + 1 for i, g in enumerate(groups)}
    color_index: dict[int, int] = {}
    for order, group_title, label, x, y in series:
        r = row_of[(order, group_title)]
        keep = decimate.minmax_indices(x, y, per_series, lo, hi)
        color = PALETTE[color_index.get(r, 0) % len(PALETTE)]
        color_index[r] = color_index.get(r, 0) + 1
        fig.add_trace(go.Scatter(x=us_to_ms(x[keep]), y=y[keep], mode="lines", name=label,
                                 legendgroup=group_title, line={"width": 1.3, "color": color},
                                 showlegend=False,
                                 hovertemplate=f"{label}: %{{y:.4g}}<extra>{group_title}</extra>"),
                      row=r, col=1)
    if rows.labels:
        gantt_row = len(heights)
        budget = max_points - _n_points(fig)
        _add_framework_gantt(fig, framework, rows, span, budget, row=gantt_row)
        fig.update_yaxes(tickvals=list(range(len(rows.labels))), ticktext=rows.labels,
                         range=[len(rows.labels) - 0.5, -0.5], fixedrange=True, showgrid=False,
                         automargin=True, row=gantt_row, col=1)
    fig.update_xaxes(type="date", range=[lo / 1000.0, hi / 1000.0], showticklabels=True)
    fig.update_annotations(font={"size": 12, "color": "#374151"}, xanchor="left", x=0)
    _layout(fig, total, showlegend=bool(rows.labels), margin={"l": 60, "r": 20, "t": 50, "b": 40},
            title={"text": title} if title else None)
    return fig


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
    getnext_x: np.ndarray  # GetNext starts, epoch us
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


def _refined(x: np.ndarray, y: np.ndarray, span: tuple[int, int], window: tuple[int, int] | None,
             buckets: int) -> np.ndarray:
    """Coarse buckets over the whole job, fine buckets inside the window (refine on zoom)."""
    keep = decimate.minmax_indices(x, y, OVERVIEW_COARSE_BUCKETS, *span)
    if window is not None and len(x):
        lo, hi = np.searchsorted(x, window[0], "left"), np.searchsorted(x, window[1], "right")
        inner = decimate.minmax_indices(x[lo:hi], y[lo:hi], buckets, *window) + lo
        keep = np.union1d(keep, inner)
    return keep


def overview_figure(series: OverviewSeries, window: tuple[int, int] | None = None,
                    uirevision: str = "overview", buckets: int = decimate.DEFAULT_BUCKETS) -> go.Figure:
    """The whole job: mean CPU (and GPU) utilization and GetNext durations over time, with a
    range slider. Its x range is the window; dragging on it (zoom, box select or slider)
    chooses a new one.
    """
    span = (series.start_us, series.end_us)
    fig = go.Figure()
    for x, y, name, color in ((series.cpu_x, series.cpu_y, "CPU % (mean)", "#94a3b8"),
                              (series.gpu_x, series.gpu_y, "GPU % (mean)", "#16a34a")):
        if len(x):
            keep = _refined(x, y, span, window, buckets)
            fig.add_trace(go.Scatter(x=us_to_ms(x[keep]), y=y[keep], name=name, mode="lines",
                                     line={"width": 1, "color": color}, fill="tozeroy" if "CPU" in name else None,
                                     fillcolor="rgba(148,163,184,0.25)",
                                     hovertemplate="%{y:.1f} %<extra>" + name + "</extra>"))
    if len(series.getnext_x):
        keep = _refined(series.getnext_x, series.getnext_y, span, window, buckets)
        fig.add_trace(go.Scatter(x=us_to_ms(series.getnext_x[keep]), y=series.getnext_y[keep],
                                 name="GetNext (ms)", mode="markers", yaxis="y2",
                                 marker={"size": 4, "color": "#2563eb", "opacity": 0.7},
                                 hovertemplate="GetNext %{y:.3f} ms<extra></extra>"))
    lo, hi = window if window is not None else span
    fig.update_layout(
        xaxis={"type": "date", "range": [lo / 1000.0, hi / 1000.0],
               "rangeslider": {"visible": True, "thickness": 0.18,
                               "range": [series.start_us / 1000.0, series.end_us / 1000.0]}},
        yaxis={"title": {"text": "utilization %"}, "fixedrange": True, "range": [0, 105]},
        yaxis2={"title": {"text": "GetNext ms"}, "type": "log", "overlaying": "y", "side": "right",
                "fixedrange": True, "showgrid": False},
        dragmode="zoom", selectdirection="h", uirevision=uirevision)
    if not fig.data:
        return empty_figure("No events or metrics in this trial")
    return _layout(fig, 300, margin={"l": 60, "r": 60, "t": 30, "b": 20})


# --- the four panels -------------------------------------------------------------------------

def _worker_label(value) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return "worker ?"
    return "main process" if int(value) < 0 else f"worker {int(value)}"


def initialization_figure(init: InitializationResult) -> go.Figure:
    """Iterator initializations over time (duration in ms), one colour per iterator class."""
    events = init.events
    if events.empty:
        return empty_figure("No DataLoader iterator initializations recorded")
    fig = go.Figure()
    for i, (cls, part) in enumerate(events.groupby("type", sort=True)):
        x, y = part["start_us"].to_numpy(), part["duration_us"].to_numpy() / 1000.0
        keep = decimate.minmax_indices(x, y)
        fig.add_trace(go.Scatter(x=us_to_ms(x[keep]), y=y[keep], mode="markers", name=str(cls),
                                 marker={"size": 8, "color": PALETTE[i % len(PALETTE)]},
                                 hovertemplate="%{y:.3f} ms<extra>" + str(cls) + "</extra>"))
    _add_outlier_markers(fig, init.outliers, "duration_us", 1000.0)
    fig.update_xaxes(type="date")
    fig.update_yaxes(title={"text": "initialization ms"}, type="log")
    return _layout(fig, 280)


def _add_outlier_markers(fig: go.Figure, outliers: pd.DataFrame, column: str, scale: float,
                         limit: int = 5_000) -> None:
    if outliers.empty:
        return
    part = outliers.head(limit)  # longest first
    fig.add_trace(go.Scatter(x=us_to_ms(part["start_us"].to_numpy()), y=part[column].to_numpy() / scale,
                             mode="markers", name="outlier",
                             marker={"size": 11, "color": "rgba(0,0,0,0)",
                                     "line": {"color": OUTLIER_COLOR, "width": 2}},
                             hoverinfo="skip"))


def workers_figure(workers: DurationStats) -> go.Figure:
    """Worker process lifetimes as a Gantt, one row per node and process."""
    events = workers.events
    if events.empty:
        return empty_figure("No DataLoader worker processes recorded (single-process loaders)")
    frame = events.assign(phase=fmt.PHASE_WORKER)
    rows = gantt_rows(frame, max_rows=60)
    span = int(events["end_us"].max() - events["start_us"].min())
    outlier = np.zeros(len(events), dtype="int8")
    if not workers.outliers.empty:
        key = pd.MultiIndex.from_frame(workers.outliers[["start_us", "end_us", "pid"]].astype("float64"))
        mine = pd.MultiIndex.from_frame(events[["start_us", "end_us", "pid"]].astype("float64"))
        outlier = mine.isin(key).astype("int8")
    fig = go.Figure()
    _gantt_traces(fig, events["start_us"].to_numpy(), events["end_us"].to_numpy(), rows.row, outlier,
                  ["worker", "outlier"], [PHASE_COLORS[fmt.PHASE_WORKER], OUTLIER_COLOR],
                  _event_hover(events), gap_us=span / decimate.DEFAULT_BUCKETS, line_px=10)
    fig.update_xaxes(type="date")
    fig.update_yaxes(tickvals=list(range(len(rows.labels))),
                     ticktext=[label.replace(f"{fmt.PHASE_WORKER} · ", "") for label in rows.labels],
                     range=[len(rows.labels) - 0.5, -0.5], showgrid=False, automargin=True)
    return _layout(fig, min(900, 90 + 20 * len(rows.labels)))


def getnext_histogram(getnext: DurationStats, outlier_factor: float) -> go.Figure:
    """How long GetNext takes: counts in log-spaced duration bins."""
    durations = getnext.events["duration_us"].to_numpy()
    if len(durations) == 0:
        return empty_figure("No GetNext calls recorded")
    edges, counts = decimate.log_histogram(durations)
    fig = go.Figure(go.Bar(x=(edges[:-1] + edges[1:]) / 2, y=counts, width=np.diff(edges),
                           marker={"color": "#2563eb", "line": {"width": 0}},
                           customdata=np.stack([edges[:-1], edges[1:]], axis=1),
                           hovertemplate="%{customdata[0]:,.0f}–%{customdata[1]:,.0f} us: %{y} calls"
                                         "<extra></extra>"))
    if getnext.median_us:
        for value, label, dash in ((getnext.median_us, "median", "solid"),
                                   (getnext.median_us * outlier_factor, f"{outlier_factor:g}× median", "dot")):
            fig.add_vline(x=value, line={"color": OUTLIER_COLOR if dash == "dot" else "#111827",
                                         "dash": dash, "width": 1.5},
                          annotation_text=label, annotation_position="top")
    fig.update_xaxes(type="log", title={"text": "GetNext duration (us, log scale)"})
    fig.update_yaxes(title={"text": "calls"})
    return _layout(fig, 280, bargap=0, showlegend=False)


def getnext_timeline(getnext: DurationStats, outlier_factor: float) -> go.Figure:
    """GetNext durations over time, one colour per worker id."""
    events = getnext.events
    if events.empty:
        return empty_figure("No GetNext calls recorded")
    fig = go.Figure()
    workers = events["worker_id"].astype("float64").fillna(-2).to_numpy()
    x_all, y_all = events["start_us"].to_numpy(), events["duration_us"].to_numpy() / 1000.0
    values = np.unique(workers)
    buckets = max(100, min(decimate.DEFAULT_BUCKETS, MAX_POINTS // (2 * len(values))))
    for i, worker in enumerate(values):
        mask = workers == worker
        x, y = x_all[mask], y_all[mask]
        keep = decimate.minmax_indices(x, y, buckets)
        label = _worker_label(None if worker == -2 else worker)
        fig.add_trace(go.Scattergl(x=us_to_ms(x[keep]), y=y[keep], mode="markers", name=label,
                                   marker={"size": 4, "color": PALETTE[i % len(PALETTE)]},
                                   hovertemplate="%{y:.3f} ms<extra>" + label + "</extra>"))
    if getnext.median_us:
        fig.add_hline(y=getnext.median_us * outlier_factor / 1000.0,
                      line={"color": OUTLIER_COLOR, "dash": "dot", "width": 1.2},
                      annotation_text=f"outlier threshold ({outlier_factor:g}× median)",
                      annotation_position="top left")
    fig.update_xaxes(type="date")
    fig.update_yaxes(type="log", title={"text": "GetNext ms"})
    return _layout(fig, 280)


def batchtime_figure(batch: BatchTimeResult) -> go.Figure:
    """BatchTime over time with its median; outliers ringed in red."""
    batches = batch.batches
    if batches.empty:
        return empty_figure("No batch times (fewer than two GetNext calls per iterator)")
    x, y = batches["start_us"].to_numpy(), batches["batch_time_s"].to_numpy().astype("float64")
    keep = decimate.minmax_indices(x, y)
    fig = go.Figure(go.Scattergl(x=us_to_ms(x[keep]), y=y[keep], mode="lines+markers", name="batch time",
                                 line={"width": 1, "color": "#2563eb"}, marker={"size": 3},
                                 hovertemplate="%{y:.4f} s<extra></extra>"))
    if not batch.outliers.empty:
        part = batch.outliers.head(5_000)
        fig.add_trace(go.Scattergl(x=us_to_ms(part["start_us"].to_numpy()), y=part["batch_time_s"].to_numpy(),
                                   mode="markers", name="outlier",
                                   marker={"size": 9, "color": OUTLIER_COLOR, "symbol": "circle-open",
                                           "line": {"width": 2}},
                                   hovertemplate="outlier %{y:.4f} s<extra></extra>"))
    if batch.median_s is not None:
        fig.add_hline(y=batch.median_s, line={"color": "#111827", "width": 1.5},
                      annotation_text=f"median {batch.median_s:.4f} s", annotation_position="top left")
    fig.update_xaxes(type="date")
    fig.update_yaxes(title={"text": "BatchTime (s)"}, rangemode="tozero")
    return _layout(fig, 280)
