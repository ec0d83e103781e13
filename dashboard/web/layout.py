"""The page: components and their ids. Ids are defined here once; callbacks and tests use them."""
from __future__ import annotations

import dash_ag_grid as dag
from dash import dcc, html

from . import figures
from ..report import CLASS_WORDS
from .views import duration_text


class Ids:
    """Element ids. Those marked stable are relied on by tests (ours and others')."""
    URL = "url"
    URL_SYNC = "url-sync"
    LOAD_REQUEST = "load-request"
    TRIAL_STORE = "trial-store"
    WINDOW_STORE = "window-store"
    OVERVIEW_DRAGMODE = "overview-dragmode"

    TRIAL_PATH = "trial-path"  # stable
    LOAD = "load-trial"  # stable
    REFRESH = "refresh-trial"
    NODE = "node-select"
    PROGRESS_WRAP = "load-progress-wrap"
    PROGRESS = "load-progress"
    STATUS = "load-status"
    ERROR = "error-message"  # stable

    SUMMARY = "summary"
    # Inside the summary once a trial is shown:
    VERDICT = "verdict"
    VERDICT_CLASS = "verdict-class"  # stable: highly | moderately | not | none
    VERDICT_PERCENT = "verdict-percent"  # stable: e.g. "74.8", "-" without a verdict
    VERDICT_NODES = "verdict-nodes"
    RECOMMENDATIONS = "recommendations"  # stable: each finding a .recommendation[data-id=<its id>]
    NOT_RECORDED = "not-recorded"
    # A finding's "show" button: {"type": SHOW_WINDOW, "index": "<finding>:<n>", "start_us", "end_us"}
    SHOW_WINDOW = "show-window"

    INIT_COUNT = "init-count"  # stable
    INIT_MEDIAN = "init-median-us"
    INIT_MAX = "init-max-us"
    INIT_ITERATORS = "init-iterators"
    INIT_GRAPH = "init-graph"
    INIT_OUTLIER_COUNT = "init-outlier-count"
    INIT_OUTLIERS = "init-outliers"
    INIT_NOTE = "init-not-recorded"

    WORKERS_COUNT = "workers-count"  # stable
    WORKERS_MEDIAN = "workers-median-us"
    WORKERS_MAX = "workers-max-us"
    WORKERS_GRAPH = "workers-graph"
    WORKERS_OUTLIER_COUNT = "workers-outlier-count"
    WORKERS_OUTLIERS = "workers-outliers"
    WORKERS_NOTE = "workers-not-recorded"

    GETNEXT_COUNT = "getnext-count"  # stable
    GETNEXT_MEDIAN = "getnext-median-us"  # stable
    GETNEXT_MAX = "getnext-max-us"
    GETNEXT_HISTOGRAM = "getnext-histogram"
    GETNEXT_TIMELINE = "getnext-timeline"
    GETNEXT_OUTLIER_COUNT = "getnext-outlier-count"
    GETNEXT_OUTLIERS = "getnext-outliers"  # stable

    BATCH_COUNT = "batchtime-count"
    BATCH_MEDIAN = "batchtime-median-s"  # stable
    BATCH_GRAPH = "batchtime-graph"
    BATCH_OUTLIER_COUNT = "batchtime-outlier-count"
    BATCH_OUTLIERS = "batchtime-outliers"

    TIMELINE = "timeline"
    OVERVIEW = "overview-graph"  # stable
    WINDOW_GRAPH = "window-graph"  # stable
    WINDOW_RANGE = "window-range"  # stable
    WINDOW_ERROR = "window-error"
    SELECT_EVENTS = "select-events"
    SELECT_DIMENSIONS = "select-dimensions"
    WHOLE_JOB = "window-whole-job"


# The outlier tables, in the order callbacks list them.
OUTLIER_TABLES = [Ids.INIT_OUTLIERS, Ids.WORKERS_OUTLIERS, Ids.GETNEXT_OUTLIERS, Ids.BATCH_OUTLIERS]

# Widths that show a whole ISO time, an iterator class, a node id; a narrow panel scrolls sideways.
_TIME_COLUMNS = [{"headerName": "start (UTC)", "field": "start", "minWidth": 215},
                 {"headerName": "end (UTC)", "field": "end", "minWidth": 215}]
_DURATION = {"headerName": "duration (us)", "field": "duration_us"}
_NODE = {"headerName": "node", "field": "node", "minWidth": 130}
_WHO = [{"headerName": "worker id", "field": "worker_id"}, {"headerName": "pid", "field": "pid"}, _NODE]
OUTLIER_COLUMNS = {
    Ids.INIT_OUTLIERS: _TIME_COLUMNS + [_DURATION, {"headerName": "iterator", "field": "type", "minWidth": 250},
                                        {"headerName": "pid", "field": "pid"}, _NODE],
    Ids.WORKERS_OUTLIERS: _TIME_COLUMNS + [_DURATION] + _WHO,
    Ids.GETNEXT_OUTLIERS: _TIME_COLUMNS + [_DURATION] + _WHO,
    Ids.BATCH_OUTLIERS: _TIME_COLUMNS + [{"headerName": "batch time (s)", "field": "batch_time_s"}] + _WHO,
}
ITERATOR_COLUMNS = [{"headerName": "iterator", "field": "type", "minWidth": 250},
                    {"headerName": "num_workers", "field": "num_workers"},
                    {"headerName": "pin_memory", "field": "pin_memory"},
                    {"headerName": "times initialized", "field": "count"},
                    {"headerName": "median (us)", "field": "median_us"}, {"headerName": "max (us)", "field": "max_us"}]


def _table(id_: str, columns: list[dict], **grid_options) -> dag.AgGrid:
    return dag.AgGrid(
        id=id_, columnDefs=columns, rowData=[], className="table",
        # Values are shown as the views wrote them ("not recorded" among numbers): no type guessing.
        defaultColDef={"sortable": False, "resizable": True, "cellDataType": False, "suppressMovable": True,
                       "flex": 1, "minWidth": 95, "wrapHeaderText": True, "autoHeaderHeight": True},
        style={"width": "100%"},
        dashGridOptions={"domLayout": "autoHeight", "suppressCellFocus": True, **grid_options})


def _graph(id_: str, figure=None, **config) -> dcc.Graph:
    return dcc.Graph(id=id_, figure=figure or figures.empty_figure_spec("No trial loaded yet"),
                     # No "Share chart" button: it would upload the trial's data to Plotly's cloud.
                     config={"displaylogo": False, "showSendToCloud": False, "showEditInChartStudio": False,
                             "modeBarButtonsToRemove": ["lasso2d", "sendChartToCloud"], **config})


def _stat(label: str, id_: str, unit: str = "") -> html.Div:
    return html.Div(className="stat", children=[
        html.Div(label, className="stat-label"),
        html.Div([html.Span("-", id=id_, className="stat-value"),
                  html.Span(f" {unit}" if unit else "", className="stat-unit")])])


def outlier_table(id_: str) -> dag.AgGrid:
    """Clicking a row selects it: the window moves to that event (selectedRows)."""
    return _table(id_, OUTLIER_COLUMNS[id_], pagination=True, paginationPageSize=8,
                  paginationPageSizeSelector=False,
                  rowSelection={"mode": "singleRow", "checkboxes": False, "enableClickSelection": True})


def _outliers_block(table_id: str, count_id: str, title: str) -> html.Div:
    return html.Div(className="outliers", children=[
        html.H3([title, " ", html.Span("0", id=count_id, className="badge")]),
        html.P("Click a row to inspect it on the timeline.", className="hint"),
        outlier_table(table_id)])


def _stats(*stats: html.Div) -> html.Div:
    return html.Div(className="stats", children=list(stats))


def _panel(title: str, description: str, children: list, note_id: str | None = None) -> html.Section:
    note = [html.P(id=note_id, className="not-recorded-note")] if note_id else []
    return html.Section(className="panel", children=[html.H2(title), html.P(description, className="hint"),
                                                      *note, *children])


def build_layout(default_trial: str) -> html.Div:
    trial_form = html.Div(className="trial-form", children=[
        dcc.Input(id=Ids.TRIAL_PATH, type="text", value=default_trial, debounce=False,
                  placeholder="s3://bucket/job/profiler-output or /path/to/trial", className="trial-path",
                  spellCheck=False, autoComplete="off"),
        html.Button("Load", id=Ids.LOAD, n_clicks=0, className="button primary"),
        html.Button("Refresh", id=Ids.REFRESH, n_clicks=0, className="button",
                    title="Read the trial again if it changed (a job still writing)"),
        dcc.Dropdown(id=Ids.NODE, options=[{"label": "all nodes", "value": ""}], value="",
                     clearable=False, searchable=False, className="node-select"),
    ])
    header = html.Header(className="header", children=[
        html.Div(className="title", children=[html.H1("DataLoader Profiler"),
                                              html.Span("PyTorch DataLoader analysis of a profiler trial",
                                                        className="subtitle")]),
        trial_form,
        html.Div(id=Ids.PROGRESS_WRAP, className="progress hidden", children=[
            html.Progress(id=Ids.PROGRESS, value="0", max="1"), html.Span(id=Ids.STATUS, className="hint")]),
        html.Div(id=Ids.ERROR, role="alert", className="error"),
    ])

    init_panel = _panel("Initialization", "Each DataLoader iterator created: its class and configuration.", [
        _stats(_stat("iterators initialized", Ids.INIT_COUNT),
               _stat("median", Ids.INIT_MEDIAN, "us"),
               _stat("max", Ids.INIT_MAX, "us")),
        _table(Ids.INIT_ITERATORS, ITERATOR_COLUMNS),
        _graph(Ids.INIT_GRAPH),
        _outliers_block(Ids.INIT_OUTLIERS, Ids.INIT_OUTLIER_COUNT, "Initialization outliers")],
        note_id=Ids.INIT_NOTE)
    workers_panel = _panel("Workers", "DataLoader worker processes and how long each lived.", [
        _stats(_stat("worker processes", Ids.WORKERS_COUNT),
               _stat("median lifetime", Ids.WORKERS_MEDIAN, "us"),
               _stat("max lifetime", Ids.WORKERS_MAX, "us")),
        _graph(Ids.WORKERS_GRAPH),
        _outliers_block(Ids.WORKERS_OUTLIERS, Ids.WORKERS_OUTLIER_COUNT, "Worker outliers")],
        note_id=Ids.WORKERS_NOTE)
    getnext_panel = _panel("GetNext", "Time the training loop waited for each batch.", [
        _stats(_stat("GetNext calls", Ids.GETNEXT_COUNT),
               _stat("median", Ids.GETNEXT_MEDIAN, "us"),
               _stat("max", Ids.GETNEXT_MAX, "us")),
        _graph(Ids.GETNEXT_HISTOGRAM),
        _graph(Ids.GETNEXT_TIMELINE),
        _outliers_block(Ids.GETNEXT_OUTLIERS, Ids.GETNEXT_OUTLIER_COUNT, "GetNext outliers")])
    batch_panel = _panel("Batch time", "From one GetNext to the next of the same iterator: "
                                       "fetch plus the training step.", [
        _stats(_stat("batches", Ids.BATCH_COUNT),
               _stat("median", Ids.BATCH_MEDIAN, "s")),
        _graph(Ids.BATCH_GRAPH),
        _outliers_block(Ids.BATCH_OUTLIERS, Ids.BATCH_OUTLIER_COUNT, "Batch time outliers")])

    timeline = html.Section(id=Ids.TIMELINE, className="panel timeline", children=[
        html.H2("Timeline"),
        html.P("Drag across the overview (or use the range slider or box select) to choose a window; "
               "double-click for the whole job.", className="hint"),
        _graph(Ids.OVERVIEW),
        html.Div(className="window-bar", children=[
            html.Div(className="window-range-box", children=[
                html.Span("Window ", className="stat-label"),
                html.Span("-", id=Ids.WINDOW_RANGE, className="window-range")]),
            html.Label(["events ", dcc.Input(id=Ids.SELECT_EVENTS, type="text", value=".*", debounce=True,
                                             className="regex", spellCheck=False)],
                       title="regular expression on event name or phase (select_events)"),
            html.Label(["dimensions ", dcc.Input(id=Ids.SELECT_DIMENSIONS, type="text", value=".*",
                                                 debounce=True, className="regex", spellCheck=False)],
                       title="regular expression on metric dimension, name or type (select_dimensions)"),
            html.Button("Whole job", id=Ids.WHOLE_JOB, n_clicks=0, className="button"),
        ]),
        html.Div(id=Ids.WINDOW_ERROR, role="alert", className="error"),
        _graph(Ids.WINDOW_GRAPH),
    ])

    return html.Div(className="page", children=[
        dcc.Location(id=Ids.URL, refresh=False),
        dcc.Store(id=Ids.URL_SYNC),
        dcc.Store(id=Ids.LOAD_REQUEST),
        dcc.Store(id=Ids.TRIAL_STORE),
        dcc.Store(id=Ids.WINDOW_STORE),
        dcc.Store(id=Ids.OVERVIEW_DRAGMODE),
        header,
        html.Main(children=[
            html.Section(className="panel summary", children=[html.H2("Summary"),
                                                              html.Div(id=Ids.SUMMARY, children=html.P(
                                                                  "No trial loaded yet.", className="hint"))]),
            html.Div(className="grid", children=[init_panel, workers_panel, getnext_panel, batch_panel]),
            timeline,
        ]),
    ])


def summary_component(data: dict, verdict: dict) -> html.Div:
    """The summary panel's body: the verdict and the findings first (views.verdict_summary()),
    then what was read (views.summary())."""
    skipped = data["files_skipped"]
    with_lines = data["files_with_skipped_lines"]
    items = [("Trial", data["path"]), ("Start", data["start"]), ("End", data["end"]),
             ("Duration", duration_text(data["duration_s"])),
             ("Nodes", ", ".join(data["nodes"]) or "-"), ("Processes", str(data["processes"])),
             ("Events read", f"{data['framework_events']:,} framework events, "
                             f"{data['system_samples']:,} system samples"),
             ("Files", f"{data['files_read']:,} read, {len(skipped):,} skipped"),
             ("Lines skipped", f"{data['lines_skipped']:,}")]
    facts = [html.H3("Trial", className="summary-heading"), html.Dl(className="summary-list", children=[
        part for label, value in items for part in (html.Dt(label), html.Dd(value))])]
    if skipped or with_lines:
        facts.append(html.Details(className="skipped", children=[
            html.Summary(f"Why: {len(skipped)} file(s) skipped, {len(with_lines)} file(s) with skipped lines"),
            html.Ul([html.Li([html.Code(s["path"]), ": ", s["reason"]]) for s in (skipped + with_lines)[:200]]),
        ]))
    return html.Div(verdict_component(verdict) + [html.Div(className="summary-facts", children=facts)])


def _code_text(text: str) -> list:
    """Text with `code` spans (as the findings write DataLoader arguments) as <code>."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: plain text
        return [text]
    return [html.Code(part) if i % 2 else part for i, part in enumerate(parts) if part]


def _verdict_badge(cls: str, percent: str) -> html.Div:
    words = CLASS_WORDS[cls]
    rest = words[len(cls):] if words.startswith(cls) else f": {words}"
    if cls == "none":
        figure = html.Span(["no verdict (", html.Span(percent, id=Ids.VERDICT_PERCENT), ")"],
                           className="verdict-figure")
    else:
        figure = html.Span([html.Span(percent, id=Ids.VERDICT_PERCENT, className="verdict-number"),
                            " % of training time waits for data (GetNext)"], className="verdict-figure")
    return html.Div(className="verdict-line", children=[
        html.Span([html.Span(cls, id=Ids.VERDICT_CLASS), rest], className=f"verdict-badge verdict-{cls}"),
        figure])


def _finding(number: int, item: dict) -> html.Li:
    head = [html.Span(f"{number}.", className="finding-number"), html.Code(item["id"], className="finding-id")]
    if item["saving"]:
        head.append(html.Span(item["saving"], className="saving"))
    children = [html.Div(head, className="finding-head"), html.P(_code_text(item["text"]), className="finding-text")]
    windows = item["windows"]
    if windows:
        children.append(html.Div(className="finding-windows", children=[
            html.Span("On the timeline:", className="hint")] + [
            html.Span(className="evidence-window", title=f"{w['label']} at {w['at']}", children=[
                html.Button("show", n_clicks=0, className="show-window",
                            id={"type": Ids.SHOW_WINDOW, "index": f"{item['id']}:{n}",
                                "start_us": w["start_us"], "end_us": w["end_us"]}),
                html.Span(w["label"], className="evidence-label")])
            for n, w in enumerate(windows)]))
    return html.Li(className="recommendation", children=children, **{"data-id": item["id"]})


def verdict_component(verdict: dict) -> list:
    """The verdict badge, the per-node verdicts and the findings, in that order."""
    title = "Verdict" + (f" for {verdict['node']}" if verdict["node"] else "")
    children = [html.H3(title, className="summary-heading"),
                _verdict_badge(verdict["class"], verdict["percent"]),
                html.P(verdict["basis"], className="hint verdict-basis")]
    if verdict["nodes"]:
        children.append(html.Table(id=Ids.VERDICT_NODES, className="verdict-nodes", children=[
            html.Thead(html.Tr([html.Th("node"), html.Th("input-bound %"), html.Th("verdict")])),
            html.Tbody([html.Tr([html.Td(row["node"]), html.Td(row["percent"], className="number"),
                                 html.Td(CLASS_WORDS[row["class"]], className=f"verdict-{row['class']}")],
                                title=row["basis"], **{"data-node": row["node"]})
                        for row in verdict["nodes"]])]))
    if verdict["not_recorded"]:
        children.append(html.P(verdict["not_recorded"], id=Ids.NOT_RECORDED, className="not-recorded-note"))
    findings = verdict["findings"]
    children.append(html.H3(["Findings ", html.Span(str(len(findings)), className="badge count")],
                            className="summary-heading"))
    children.append(html.Div(id=Ids.RECOMMENDATIONS, className="recommendations", children=(
        html.Ol([_finding(n, item) for n, item in enumerate(findings, 1)], className="findings")
        if findings else html.P("No findings: nothing to change in the input pipeline.", className="no-findings"))))
    return [html.Div(id=Ids.VERDICT, className="verdict", children=children)]
