"""The page: components and their ids. Ids are defined here once; callbacks and tests use them."""
from __future__ import annotations

import dash_ag_grid as dag
from dash import dcc, html

from . import figures
from ..display import TIME_ZONE, duration_s
from ..report import CLASS_WORDS, PART_WORDS


class Ids:
    """Element ids. Those marked stable are relied on by tests (ours and others')."""
    URL = "url"
    URL_SYNC = "url-sync"
    LOAD_REQUEST = "load-request"
    TRIAL_STORE = "trial-store"
    WINDOW_STORE = "window-store"

    TRIAL_PATH = "trial-path"  # stable
    LOAD = "load-trial"  # stable
    REFRESH = "refresh-trial"
    NODE = "node-select"
    PROGRESS_WRAP = "load-progress-wrap"
    PROGRESS = "load-progress"
    STATUS = "load-status"
    ERROR = "error-message"  # stable
    SHOWN_TRIAL = "shown-trial"  # the trial the panels show; className "shown-trial stale" after a failed load

    SUMMARY = "summary"  # stable: the verdict, the wait budget, the findings, the what-if, what was read
    SUMMARY_VERDICT = "summary-verdict"
    SUMMARY_FINDINGS = "summary-findings"
    SUMMARY_FACTS = "summary-facts"
    # The wait budget: one bar per training loader, a click on a part shows its window.
    BUDGET = "budget"
    BUDGET_GRAPH = "budget-graph"  # stable: traces' meta name their part (views.PARTS), rows the loaders
    BUDGET_NOTE = "budget-note"
    # The what-if: settings in (empty: unchanged), today's and the predicted wait out.
    WHAT_IF = "what-if"
    WHAT_IF_WORKERS = "what-if-num-workers"  # stable
    WHAT_IF_PREFETCH = "what-if-prefetch-factor"  # stable
    WHAT_IF_IN_ORDER = "what-if-in-order"  # stable: "" (unchanged), "true", "false"
    WHAT_IF_PERSISTENT = "what-if-persistent-workers"  # stable: as in_order
    WHAT_IF_LOADER = "what-if-loader"  # "" (all) or views.loader_key()
    WHAT_IF_LOADER_WRAP = "what-if-loader-wrap"
    WHAT_IF_ERROR = "what-if-error"  # stable: the library's message for a bad setting
    WHAT_IF_GRAPH = "what-if-graph"  # stable
    WHAT_IF_RESULT = "what-if-result"  # stable: one line per loader, each .what-if-line[data-key]
    # A finding's "try" button: {"type": TRY_WHAT_IF, "index": "<finding>", "change": "k=v,...", "loader"}
    TRY_WHAT_IF = "try-what-if"
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
    INIT_BODY = "init-body"  # its className ends in " collapsed" when nothing of it was recorded

    WORKERS_COUNT = "workers-count"  # stable
    WORKERS_MEDIAN = "workers-median-us"
    WORKERS_MAX = "workers-max-us"
    WORKERS_GRAPH = "workers-graph"
    WORKERS_OUTLIER_COUNT = "workers-outlier-count"
    WORKERS_OUTLIERS = "workers-outliers"
    WORKERS_NOTE = "workers-not-recorded"
    WORKERS_BODY = "workers-body"

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

    # Data waiting by rank over time (a job of several processes): a click on a cell sets the
    # window to its time bucket and scopes the page to its process.
    RANKS = "ranks"  # className "panel ranks hidden" for a job of one process
    RANK_HEATMAP = "rank-heatmap"  # stable: cells' customdata is [process id, start_us, end_us]
    RANK_ORDER = "rank-order"  # stable: "host" or "wait"
    RANK_NOTE = "rank-note"

    TIMELINE = "timeline"
    OVERVIEW = "overview-graph"  # stable
    WINDOW_GRAPH = "window-graph"  # stable
    WINDOW_RANGE = "window-range"  # stable
    WINDOW_ERROR = "window-error"
    SELECT_EVENTS = "select-events"
    SELECT_DIMENSIONS = "select-dimensions"
    WHOLE_JOB = "window-whole-job"

    # Follow a running job: re-read the trial every few seconds (only new or changed files).
    FOLLOW = "follow"  # stable: a checklist, value ["on"] while following
    FOLLOW_INTERVAL = "follow-interval"
    FOLLOW_STATE = "follow-state"  # when the trial last changed, while following
    FOLLOW_NOTE = "follow-note"  # stable: following, paused (tab hidden), or stopped and why
    FOLLOW_WINDOW = "follow-window"  # stable: "" (the window stays), or minutes: the newest ones
    VISIBILITY = "page-visibility"  # document.visibilityState, set by the page itself

    # Downloads (one dcc.Download for all): an outlier table's CSV (its button: csv_button()),
    # the analysis as the `analyze --json` object, the window as a Chrome/Perfetto trace.
    DOWNLOAD = "download"
    EXPORT_JSON = "export-analysis-json"  # stable
    EXPORT_TRACE = "export-window-trace"  # stable

    # Compare with a second trial (?trial=A&compare=B): A is the trial shown, B the run after a change.
    COMPARE_PATH = "compare-path"  # stable
    COMPARE = "compare-trial"  # stable: the button
    COMPARE_REQUEST = "compare-request"
    COMPARE_STORE = "compare-store"
    COMPARE_SECTION = "compare"  # stable: hidden until a comparison is shown
    COMPARE_BODY = "compare-body"
    COMPARE_ERROR = "compare-error"  # stable
    COMPARE_DELTAS = "compare-deltas"  # stable: tr[data-key] (training_s, wait_s, input_percent, verdict)
    COMPARE_SETTINGS = "compare-settings"  # stable: li[data-key] per setting changed
    COMPARE_FINDINGS = "compare-findings"  # stable: li.compare-finding[data-id][data-status]
    COMPARE_PREDICTION = "compare-prediction"  # stable: tr[data-key] (training_s, wait_fraction)
    COMPARE_BUDGET = "compare-budget"  # both runs' wait budgets, A's bars above B's
    COMPARE_GETNEXT = "compare-getnext"
    COMPARE_BATCH = "compare-batchtime"


# The outlier tables, in the order callbacks list them.
OUTLIER_TABLES = [Ids.INIT_OUTLIERS, Ids.WORKERS_OUTLIERS, Ids.GETNEXT_OUTLIERS, Ids.BATCH_OUTLIERS]
# Following: how often the trial is listed again, and after how long without a changed file
# following stops (a job that ended, or one that writes nothing: no reason to keep listing S3).
FOLLOW_EVERY_MS = 3_000
FOLLOW_IDLE_S = 120
FOLLOW_WINDOW_MINUTES = (1, 5, 15, 60)


def csv_button(table_id: str) -> str:
    """The id of an outlier table's CSV button (stable)."""
    return f"{table_id}-csv"

# Column widths from what they hold, so that every table fits a half-width panel at 1440 px
# (about 650 px) without sideways scrolling: `minWidth` holds the content (an ISO time at the
# tables' 12 px, a duration, a pid), `flex` shares out the rest. The end of an event is in
# its start's tooltip (and its duration beside it); long names are cut, whole in a tooltip.
_START = {"headerName": f"start ({TIME_ZONE})", "field": "start", "tooltipField": "span", "minWidth": 190,
          "flex": 3}
_DURATION = {"headerName": "duration", "field": "duration", "minWidth": 78, "flex": 1.3,
             "cellClass": "number"}
_NODE = {"headerName": "node", "field": "node", "tooltipField": "node", "minWidth": 84, "flex": 1.8}
_PID = {"headerName": "pid", "field": "pid", "minWidth": 58, "flex": 1, "cellClass": "number"}
# (A batch of the training process itself reads "main process": 94 px with the cell's padding.)
_WHO = [{"headerName": "worker", "field": "worker_id", "minWidth": 100, "flex": 1, "cellClass": "number"}, _PID, _NODE]
_ITERATOR = {"headerName": "iterator", "field": "type_short", "tooltipField": "type", "minWidth": 128, "flex": 2.4}
OUTLIER_COLUMNS = {
    Ids.INIT_OUTLIERS: [_START, _DURATION, _ITERATOR, _PID, _NODE],
    Ids.WORKERS_OUTLIERS: [_START, _DURATION] + _WHO,
    Ids.GETNEXT_OUTLIERS: [_START, _DURATION] + _WHO,
    Ids.BATCH_OUTLIERS: [_START, {**_DURATION, "headerName": "batch time"}] + _WHO,
}
ITERATOR_COLUMNS = [_ITERATOR,
                    # A DataLoader argument's name is one word: never wrapped inside it.
                    {"headerName": "num_workers", "field": "num_workers", "minWidth": 104, "cellClass": "number"},
                    {"headerName": "pin_memory", "field": "pin_memory", "minWidth": 100},
                    {"headerName": "times initialized", "field": "count", "minWidth": 70, "cellClass": "number"},
                    {"headerName": "median", "field": "median", "minWidth": 78, "cellClass": "number"},
                    {"headerName": "max", "field": "max", "minWidth": 78, "cellClass": "number"}]


def _table(id_: str, columns: list[dict], **grid_options) -> dag.AgGrid:
    return dag.AgGrid(
        id=id_, columnDefs=columns, rowData=[], className="table",
        # Values are shown as the views wrote them ("not recorded" among numbers): no type guessing.
        defaultColDef={"sortable": False, "resizable": True, "cellDataType": False, "suppressMovable": True,
                       "flex": 1, "minWidth": 60, "wrapHeaderText": True, "autoHeaderHeight": True},
        style={"width": "100%"},
        # The browser's own tooltips (a cell's title): the whole name of a shortened one.
        dashGridOptions={"domLayout": "autoHeight", "suppressCellFocus": True, "enableBrowserTooltips": True,
                         **grid_options})


def _graph(id_: str, figure=None, **config) -> dcc.Graph:
    return dcc.Graph(id=id_, figure=figure or figures.empty_figure_spec("No trial loaded yet"),
                     # No "Share chart" button: it would upload the trial's data to Plotly's cloud.
                     config={"displaylogo": False, "showSendToCloud": False, "showEditInChartStudio": False,
                             "modeBarButtonsToRemove": ["lasso2d", "sendChartToCloud"], **config})


def _stat(label: str, id_: str) -> html.Div:
    """A number of a panel; a duration carries its unit (display.duration_us)."""
    return html.Div(className="stat", children=[
        html.Div(label, className="stat-label"),
        html.Div(html.Span("-", id=id_, className="stat-value"))])


def outlier_table(id_: str) -> dag.AgGrid:
    """Clicking a row selects it: the window moves to that event (selectedRows)."""
    return _table(id_, OUTLIER_COLUMNS[id_], pagination=True, paginationPageSize=8,
                  paginationPageSizeSelector=False,
                  rowSelection={"mode": "singleRow", "checkboxes": False, "enableClickSelection": True})


def _outliers_block(table_id: str, count_id: str, title: str) -> html.Div:
    return html.Div(className="outliers", children=[
        html.H3([title, " ", html.Span("0", id=count_id, className="badge"),
                 html.Button("CSV", id=csv_button(table_id), n_clicks=0, className="button small export",
                             title="Download this table's rows as CSV")]),
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
        follow_switch(),
    ])
    header = html.Header(className="header", children=[
        html.Div(className="title", children=[html.H1("DataLoader Profiler"),
                                              html.Span("PyTorch DataLoader analysis of a profiler trial",
                                                        className="subtitle")]),
        trial_form,
        compare_form(),
        html.Div(id=Ids.PROGRESS_WRAP, className="progress hidden", children=[
            html.Progress(id=Ids.PROGRESS, value="0", max="1"), html.Span(id=Ids.STATUS, className="hint")]),
        html.Div(id=Ids.ERROR, role="alert", className="error"),
    ])

    init_panel = _panel("Initialization", "Each DataLoader iterator created: its class and configuration.", [
        _stats(_stat("iterators initialized", Ids.INIT_COUNT),
               _stat("median", Ids.INIT_MEDIAN),
               _stat("max", Ids.INIT_MAX)),
        # What was not recorded (Kineto) collapses to the panel's one-line note.
        html.Div(id=Ids.INIT_BODY, className="panel-body", children=[
            _table(Ids.INIT_ITERATORS, ITERATOR_COLUMNS),
            _graph(Ids.INIT_GRAPH),
            _outliers_block(Ids.INIT_OUTLIERS, Ids.INIT_OUTLIER_COUNT, "Initialization outliers")])],
        note_id=Ids.INIT_NOTE)
    workers_panel = _panel("Workers", "DataLoader worker processes and how long each lived.", [
        _stats(_stat("worker processes", Ids.WORKERS_COUNT),
               _stat("median lifetime", Ids.WORKERS_MEDIAN),
               _stat("max lifetime", Ids.WORKERS_MAX)),
        html.Div(id=Ids.WORKERS_BODY, className="panel-body", children=[
            _graph(Ids.WORKERS_GRAPH),
            _outliers_block(Ids.WORKERS_OUTLIERS, Ids.WORKERS_OUTLIER_COUNT, "Worker outliers")])],
        note_id=Ids.WORKERS_NOTE)
    getnext_panel = _panel("GetNext", "Time the training loop waited for each batch.", [
        _stats(_stat("GetNext calls", Ids.GETNEXT_COUNT),
               _stat("median", Ids.GETNEXT_MEDIAN),
               _stat("max", Ids.GETNEXT_MAX)),
        _graph(Ids.GETNEXT_HISTOGRAM),
        _graph(Ids.GETNEXT_TIMELINE),
        _outliers_block(Ids.GETNEXT_OUTLIERS, Ids.GETNEXT_OUTLIER_COUNT, "GetNext outliers")])
    batch_panel = _panel("Batch time", "From one GetNext to the next of the same iterator: "
                                       "fetch plus the training step.", [
        _stats(_stat("batches", Ids.BATCH_COUNT),
               _stat("median", Ids.BATCH_MEDIAN)),
        _graph(Ids.BATCH_GRAPH),
        _outliers_block(Ids.BATCH_OUTLIERS, Ids.BATCH_OUTLIER_COUNT, "Batch time outliers")])

    timeline = html.Section(id=Ids.TIMELINE, className="panel timeline", children=[
        html.H2("Timeline"),
        html.P("The overview is the whole job; its red marks are GetNext stalls (over the outlier threshold). "
               "Drag across it to choose a window, shown below; \"Whole job\" or a double-click to see "
               "all of it.", className="hint timeline-hint"),
        # A drag is a box select (the axis never zooms): no zoom or pan buttons.
        _graph(Ids.OVERVIEW, modeBarButtonsToRemove=["lasso2d", "sendChartToCloud", "zoom2d", "pan2d", "zoomIn2d",
                                                     "zoomOut2d", "autoScale2d", "resetScale2d"]),
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
            follow_window_choice(),
            html.Button("Perfetto trace", id=Ids.EXPORT_TRACE, n_clicks=0, className="button export",
                        title="Download this window as a Chrome/Perfetto JSON trace (ui.perfetto.dev, "
                              "chrome://tracing)"),
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
        *follow_stores(), *compare_stores(), dcc.Download(id=Ids.DOWNLOAD),
        header,
        html.Main(children=[
            # Which trial the panels show; after a failed load, that they are still the previous one's.
            html.Div(id=Ids.SHOWN_TRIAL, className="shown-trial"),
            html.Section(className="panel summary", children=[
                html.H2(["Summary", html.Button("Analysis (JSON)", id=Ids.EXPORT_JSON, n_clicks=0,
                                                className="button small export",
                                                title="Download the whole analysis: the `analyze --json` object")]),
                summary_skeleton()]),
            compare_section(),
            ranks_section(),
            html.Div(className="grid", children=[init_panel, workers_panel, getnext_panel, batch_panel]),
            timeline,
        ]),
    ])


_UNCHANGED = [{"label": "unchanged", "value": ""}, {"label": "True", "value": "true"},
              {"label": "False", "value": "false"}]


def _setting(label: str, control, title: str) -> html.Label:
    return html.Label(className="what-if-setting", title=title, children=[html.Code(label), control])


def _number(id_: str, placeholder: str) -> dcc.Input:
    # step "any": the browser passes whatever number is typed; the library says what is wrong with it.
    return dcc.Input(id=id_, type="number", step="any", placeholder=placeholder, debounce=False,
                     className="what-if-number", autoComplete="off")


def _choice(id_: str) -> dcc.Dropdown:
    return dcc.Dropdown(id=id_, options=_UNCHANGED, value="", clearable=False, searchable=False,
                        className="what-if-choice")


def budget_block() -> html.Div:
    """Where the wait went: one stacked bar per training loader (figures.budget_figure_spec)."""
    return html.Div(id=Ids.BUDGET, className="budget hidden", children=[
        html.H3("Where the wait went", className="summary-heading"),
        html.P("Each bar is a training loader's training time; the coloured parts are its waiting for "
               "data, by cause (seconds; hover for the share of training). Click a part to see its "
               "longest wait on the timeline.", className="hint"),
        html.P(id=Ids.BUDGET_NOTE, className="hint budget-note"),
        html.Div(className="budget-key", children=[
            html.Span(className="budget-key-item", **{"data-part": part}, children=[
                html.Span(className="swatch", style={"background": background}), words])
            for part, words, background in figures.budget_key(PART_WORDS)]),
        _graph(Ids.BUDGET_GRAPH, figures.empty_figure_spec("No trial loaded yet", height=110),
               displayModeBar=False)])


def what_if_block() -> html.Div:
    """Settings in, predicted wait out (the callback calls Assessment.predict)."""
    return html.Div(id=Ids.WHAT_IF, className="what-if hidden", children=[
        html.H3("What if", className="summary-heading"),
        html.P("Change DataLoader settings: the pipeline model replays the trial with them. "
               "Empty fields stay as they are.", className="hint"),
        html.Div(className="what-if-settings", children=[
            _setting("num_workers", _number(Ids.WHAT_IF_WORKERS, "unchanged"), "worker processes (0: none)"),
            _setting("prefetch_factor", _number(Ids.WHAT_IF_PREFETCH, "unchanged"),
                     "batches each worker prepares ahead"),
            _setting("in_order", _choice(Ids.WHAT_IF_IN_ORDER), "deliver batches in sampler order"),
            _setting("persistent_workers", _choice(Ids.WHAT_IF_PERSISTENT), "keep the workers between epochs"),
        ]),
        html.Div(id=Ids.WHAT_IF_LOADER_WRAP, className="what-if-loader hidden", children=[
            html.Label("loader", htmlFor=Ids.WHAT_IF_LOADER),
            dcc.Dropdown(id=Ids.WHAT_IF_LOADER, options=[{"label": "all loaders", "value": ""}], value="",
                         clearable=False, searchable=False, className="what-if-choice")]),
        html.Div(id=Ids.WHAT_IF_ERROR, role="alert", className="error"),
        _graph(Ids.WHAT_IF_GRAPH, figures.empty_figure_spec("No trial loaded yet", height=110),
               displayModeBar=False),
        html.Div(id=Ids.WHAT_IF_RESULT, className="what-if-result")])


def summary_skeleton() -> html.Div:
    """The summary's places: the verdict, the wait budget and the findings, beside them the
    what-if and what was read. The callbacks fill them (summary_parts); the budget and the
    what-if are fixed components, so their callbacks exist before a trial is shown."""
    return html.Div(id=Ids.SUMMARY, className="summary-body", children=[
        html.Div(className="summary-main", children=[
            html.Div(id=Ids.SUMMARY_VERDICT, children=html.P("No trial loaded yet.", className="hint")),
            budget_block(),
            html.Div(id=Ids.SUMMARY_FINDINGS)]),
        html.Div(className="summary-side", children=[what_if_block(), html.Div(id=Ids.SUMMARY_FACTS)])])


def summary_parts(data: dict, verdict: dict) -> dict:
    """The summary's filled places: "verdict", "findings" (views.verdict_summary()) and
    "facts", what was read (views.summary())."""
    return {"verdict": verdict_component(verdict), "findings": findings_component(verdict),
            "facts": facts_component(data)}


def facts_component(data: dict) -> list:
    """What was read: the trial, its span, nodes, events and files (skipped ones listed)."""
    skipped = data["files_skipped"]
    with_lines = data["files_with_skipped_lines"]
    items = [("Trial", data["path"]), ("Start", data["start"]), ("End", data["end"]),
             ("Duration", duration_s(data["duration_s"])),
             ("Nodes", data["hosts"] or "-"), ("Processes", str(data["processes"])),
             ("Events read", f"{data['framework_events']:,} framework events, "
                             f"{data['system_samples']:,} system samples"),
             ("Files", f"{data['files_read']:,} read, {len(skipped):,} skipped"),
             ("Lines skipped", f"{data['lines_skipped']:,}")]
    if data["values_ignored"]:
        items.append(("Values ignored", f"{data['values_ignored']:,} (not of their field's type: read as missing)"))
    facts = [html.H3("Trial", className="summary-heading"), html.Dl(className="summary-list", children=[
        part for label, value in items for part in (html.Dt(label), html.Dd(value))])]
    if skipped or with_lines:
        facts.append(html.Details(className="skipped", children=[
            html.Summary(f"Why: {len(skipped)} file(s) skipped, {len(with_lines)} file(s) with skipped lines"
                         + (" or ignored values" if data["values_ignored"] else "")),
            html.Ul([html.Li([html.Code(s["path"]), ": ", s["reason"]]) for s in (skipped + with_lines)[:200]]),
        ]))
    return [html.Div(className="summary-facts", children=facts)]


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
    predicted = item.get("predicted")
    if predicted:
        children.append(html.Div(className="finding-predicted", children=[
            html.Span("Predicted", className="predicted-label"),
            " with ", html.Code(predicted["change"]), ": ", html.Span(predicted["text"], className="predicted-text"),
            html.Button("try in what-if", n_clicks=0, className="show-window try-what-if",
                        title="Put these settings in the what-if",
                        id={"type": Ids.TRY_WHAT_IF, "index": item["id"], "change": predicted["change"],
                            "loader": predicted["loader"]})]))
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
    """The verdict badge, the per-node verdicts and what was not recorded."""
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
    return [html.Div(id=Ids.VERDICT, className="verdict", children=children)]


def findings_component(verdict: dict) -> list:
    """The findings, each with its saving, predicted effect and windows on the timeline."""
    findings = verdict["findings"]
    return [html.H3(["Findings ", html.Span(str(len(findings)), className="badge count")],
                    className="summary-heading"),
            html.Div(id=Ids.RECOMMENDATIONS, className="recommendations", children=(
                html.Ol([_finding(n, item) for n, item in enumerate(findings, 1)], className="findings")
                if findings else html.P(f"No findings: {verdict['no_findings']}.", className="no-findings")))]


def what_if_lines(shown: dict) -> list:
    """The what-if's result in words, one line per loader (views.what_if_view())."""
    if not shown["change"]:
        return [html.P("Type a setting to see its predicted effect.", className="hint")]
    lines = []
    for row in shown["rows"]:
        words = row["text"] or "no prediction"
        lines.append(html.Li(className="what-if-line", **{"data-key": row["key"]}, children=[
            html.Span(row["label"], className="what-if-loader-name"), ": ", words,
            *([html.Span(f"; {row['note']}", className="hint")] if row["note"] and row["predicted"] else [])]))
    return [html.P(["With ", html.Code(shown["change"]), ":"], className="what-if-change"),
            html.Ul(lines, className="what-if-lines")]


# --- following a running job, comparing two runs ---------------------------------------------------

def follow_switch() -> html.Div:
    """The Follow switch and what following is doing (Ids.FOLLOW_NOTE)."""
    return html.Div(className="follow", children=[
        dcc.Checklist(id=Ids.FOLLOW, options=[{"label": " Follow", "value": "on"}], value=[],
                      className="follow-switch", inputClassName="follow-input",
                      labelStyle={"display": "inline-flex", "alignItems": "center"}),
        html.Span(id=Ids.FOLLOW_NOTE, className="hint follow-note")],
        title=f"Re-read the trial every {FOLLOW_EVERY_MS // 1000} s while a job writes it (only new or "
              f"changed files); pauses while this tab is hidden")


def follow_window_choice() -> html.Label:
    """Whether the window stays where the user put it when the trial grows, or shows the newest minutes."""
    options = [{"label": "window stays", "value": ""}] + [
        {"label": f"newest {m} min", "value": str(m)} for m in FOLLOW_WINDOW_MINUTES]
    return html.Label(className="follow-window", title="When the trial grows (Follow, Refresh)", children=[
        dcc.Dropdown(id=Ids.FOLLOW_WINDOW, options=options, value="", clearable=False, searchable=False,
                     className="follow-window-choice")])


def follow_stores() -> list:
    return [dcc.Interval(id=Ids.FOLLOW_INTERVAL, interval=FOLLOW_EVERY_MS, disabled=True, n_intervals=0),
            dcc.Store(id=Ids.FOLLOW_STATE), dcc.Store(id=Ids.VISIBILITY, data="visible")]


def compare_form() -> html.Div:
    return html.Div(className="trial-form compare-form", children=[
        dcc.Input(id=Ids.COMPARE_PATH, type="text", value="", debounce=False,
                  placeholder="compare with a second run (after a change): s3://... or /path/to/trial",
                  className="trial-path", spellCheck=False, autoComplete="off"),
        html.Button("Compare", id=Ids.COMPARE, n_clicks=0, className="button",
                    title="Show the trial above (A) against this one (B); an empty path ends the comparison"),
        html.Div(id=Ids.COMPARE_ERROR, role="alert", className="error")])


def compare_stores() -> list:
    return [dcc.Store(id=Ids.COMPARE_REQUEST), dcc.Store(id=Ids.COMPARE_STORE)]


def ranks_section() -> html.Section:
    return html.Section(id=Ids.RANKS, className="panel ranks hidden", children=[
        html.H2("Data waiting by rank"),
        html.P("Each row a process (its host and rank), each column a stretch of the job: the darker, the "
               "less of it the process spent waiting in GetNext; the brighter, the more. Click a cell to "
               "see that stretch in the timeline, scoped to that process.", className="hint"),
        dcc.RadioItems(id=Ids.RANK_ORDER, value="host", inline=True, className="rank-order",
                       options=[{"label": "by host", "value": "host"},
                                {"label": "most waiting first", "value": "wait"}]),
        html.P(id=Ids.RANK_NOTE, className="hint"),
        _graph(Ids.RANK_HEATMAP),
    ])


def compare_section() -> html.Section:
    return html.Section(id=Ids.COMPARE_SECTION, className="panel compare hidden", children=[
        html.H2("Compared: A (above) and B"),
        html.P("What changed between the two runs, and whether the change did what A's what-if predicted.",
               className="hint"),
        html.Div(id=Ids.COMPARE_BODY)])
