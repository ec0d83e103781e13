"""The callbacks: parse inputs, call the library (views, cache), return figures and text.

Flow: the URL or a button makes a load request; a background callback loads the trial
(into the shared cache) with a progress bar; the trial's key goes to the browser, and
the panels and the window are drawn from the cached trial. The window lives in a store
that drags, outlier clicks and loads set; the URL follows the trial and the window.

No exception reaches the browser: a trial that cannot be read gets its message in
`error-message`, any other failure is logged and summarised in the page.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import parse_qs

from dash import ALL, Input, Output, State, ctx, dcc, no_update

from ..analysis.compare import Side, compare
from ..analysis import ranks
from ..analysis.diagnosis import parse_what_if
from ..trial.errors import TrialError, size_text
from ..trial.frames import host_of
from ..trial import window_files
from ..trial.load import Trial
from ..trial.store import redact, fingerprint, open_store
from . import compare_page, views
from .cache import TrialCache, trial_key, trial_spelling
from .layout import FOLLOW_IDLE_S, OUTLIER_TABLES, Ids, csv_button, summary_parts, what_if_lines

log = logging.getLogger("dashboard.web")

PROGRESS_EVERY_S = 0.2
LOGGED_MESSAGE_CHARS = 200  # of a client's text or an error in a log line: a 5 MB field must not reach the log whole
EVICTED = "This trial is no longer in the server's cache: press Load to read it again."


class TrialEvicted(Exception):
    pass


@dataclass
class Context:
    """What the callbacks need from the server's options."""
    cache: TrialCache
    default_trial: str
    roots: Sequence[str]
    s3_buckets: Sequence[str] | None = None
    max_bytes: int | None = None  # trials over these are refused (TrialTooLargeError)
    max_events: int | None = None
    # Bytes of events beyond which a trial's windows read only the files they reach (None: any
    # trial is held whole).
    event_budget: int | None = None


def queued_progress(limit: int):
    """The load's progress while it waits for a place (jobs.QueueingManager)."""
    return lambda ahead: ["0", "1", f"Queued ({ahead} ahead): the server runs {limit} loads at a time…"]


def log_text(text: str) -> str:
    """A client's text (or an error's, which may repeat it) as a short part of one log line:
    without URLs' credentials, escaped (a newline in a URL or a field would forge a line) and
    cut (a field of megabytes)."""
    text = repr(redact(str(text)))[1:-1]
    return text if len(text) <= LOGGED_MESSAGE_CHARS else text[:LOGGED_MESSAGE_CHARS] + "..."


def _unexpected(what: str, exc: BaseException) -> str:
    # One line, the traceback at debug level: a malformed callback payload makes one of these
    # per request, and a traceback at ERROR each time let a client flood the log.
    log.warning("%s failed: %s: %s", log_text(what), type(exc).__name__, log_text(str(exc)))
    log.debug("the traceback of that failure", exc_info=exc)
    return f"{redact(what)} failed ({type(exc).__name__}); the details are in the server log."


def _echoed_nonce(nonce) -> float | int | None:
    """A load request's nonce as its answer carries it back: the page's own (a time.time()), or
    None for what JSON cannot carry (an int of 2**64 or more failed the answer with HTTP 500)."""
    if isinstance(nonce, bool) or not isinstance(nonce, (int, float)):
        return None
    return nonce if math.isfinite(nonce) and abs(nonce) < 2**63 else None


def _requested_window(window) -> list[int] | None:
    """A load request's window as the URL's (views.time_window), or None: the request comes from
    the client, and an int of 2**64 or more in the load's answer failed it (orjson cannot write it)."""
    return views.time_window(*window) if isinstance(window, list) and len(window) == 2 else None


def check_held(context: Context, key: str) -> None:
    """TrialEvicted when a trial is no longer cached (its page parts then show nothing real)."""
    if not context.cache.holds(key):
        raise TrialEvicted(key)


def whole_trial(context: Context, key: str) -> Trial:
    """A cached trial; TrialEvicted when it is no longer cached."""
    trial = context.cache.trial(key)
    if trial is None:
        raise TrialEvicted(key)
    return trial


def get_view(context: Context, key: str, node: str | None) -> views.TrialView:
    """The view of a cached trial for a node, built once per process."""
    node = node or None

    def build():
        trial = whole_trial(context, key)
        assessment, analysis = context.cache.analyses(key, trial, node)
        return views.trial_view(trial, node, analysis=analysis, key=key, assessment=assessment)

    return context.cache.memo(f"view:{key}:{node or ''}", build)


# What a server process holds to draw windows from a whole trial, per byte of its frames: the
# frames, the analyses' copies of the GetNexts and the view's series. A warm server's RSS grew by
# 1.24 GB drawing a drag of the 3M-GetNext trial, whose frames count 783 MB (bench/first_page.py).
WHOLE_VIEW_PER_EVENT_BYTE = 1.6
# What reading a window's files peaks at, per byte of the window's frames (the files' tables and
# the frames built from them): reading every file of that trial as one window peaked 1.10 GB
# above what the process held before, for its 783 MB of frames.
WINDOW_READ_PER_EVENT_BYTE = 1.4


_WINDOW_READS = threading.Lock()


class WindowNotDrawn(Exception):
    """A window of a trial over the event budget that cannot be drawn: the message says why."""


def get_assessment(context: Context, key: str, node: str | None):
    """The assessment of a cached trial (or node): the one the cache kept, the trial read back
    only when it kept none (the what-if fires on every load:
    reading the trial for it held the whole trial in the server process)."""
    check_held(context, key)  # (the cache keeps what it reads in this process's memory)
    return context.cache.kept_assessment(key, node or None) or get_view(context, key, node).assessment


def draw_window(context: Context, key: str, node: str | None, start_us: int, end_us: int, select_events,
                select_dimensions, loader: str | None, selected: dict | None) -> dict:
    """views.window_payload of a cached trial's view. Every batch of the loader drawn is kept on
    the disk, as the page parts: a new server process's first drag of a 3M-GetNext trial spent
    1.1 s computing them.

    A trial over the event budget that this process does not hold is not read back whole: the
    window reads the files it reaches (_draw_window_from_files). WindowNotDrawn when the window
    alone is over the budget, or its files cannot be read again."""
    drawn = _draw_window_from_files(context, key, node, start_us, end_us, select_events, select_dimensions,
                                    loader, selected)
    if drawn is not None:
        return drawn
    view = get_view(context, key, node)
    row = views.selected_loader(view, loader)
    if row is not None:
        keep_loader_batches(context, key, node, view, row)
    if _over_budget(context, key) is not None:  # what the next process's drags take instead of the view
        context.cache.page_part(_window_base_name(key, node), lambda: views.window_base(view))
    return views.window_payload(view, start_us, end_us, select_events, select_dimensions, loader=loader,
                                selected=selected)


def keep_loader_batches(context: Context, key: str, node: str | None, view: views.TrialView, row: dict) -> None:
    """The batches of a budget row's loader in the view, kept on the disk once (a page part)."""
    if row["key"] not in view.loader_batches:
        view.loader_batches[row["key"]] = context.cache.page_part(
            _loader_batches_name(key, node, row), lambda: views.loader_batches_of(view, row))


def keep_trial_files(context: Context, key: str, trial: Trial, listing) -> None:
    """Keeps what a drag of a trial over the event budget reads its window's files with (a page
    part: any server process finds it), when the trial was loaded whole from `listing`."""
    if context.event_budget is not None and trial.report.complete:
        context.cache.page_part(f"trial-files:{key}", lambda: window_files.trial_files(trial, listing))


def _over_budget(context: Context, key: str) -> window_files.TrialFiles | None:
    """The kept files of a trial whose whole view would take more than the event budget; None
    for one within it, without a budget, or whose files the cache no longer keeps."""
    if context.event_budget is None:
        return None
    files = context.cache.kept_page_part(f"trial-files:{key}")  # (keep_trial_files)
    if files is None or files.nbytes * WHOLE_VIEW_PER_EVENT_BYTE <= context.event_budget:
        return None
    return files


def _loader_batches_name(key: str, node: str | None, row: dict) -> str:
    return f"loader-batches:{key}:{node or ''}:{row['key']}"


def _window_base_name(key: str, node: str | None) -> str:
    return f"window-base:{key}:{node or ''}"


def _draw_window_from_files(context: Context, key: str, node: str | None, start_us: int, end_us: int,
                            select_events, select_dimensions, loader: str | None, selected: dict | None):
    """The window's payload from the events of the files it reaches, for a trial over the event
    budget; None where the whole trial's view is to be used: no budget, a trial within it, one
    this process holds (its view costs nothing more), or one whose parts (its files and window
    base, kept when it was loaded and first drawn) the cache no longer has."""
    if context.cache.memoized(f"view:{key}:{node or ''}"):
        return None
    files = _over_budget(context, key)
    if files is None:
        return None
    base = context.cache.kept_page_part(_window_base_name(key, node))
    if base is None:
        return None
    row = views.loader_row(base.budget_rows, loader)
    batches = {}
    if row is not None:
        batches[row["key"]] = context.cache.kept_page_part(_loader_batches_name(key, node, row))
        if batches[row["key"]] is None:
            return None
    lo, hi = int(start_us) - base.sample_gap_us, int(end_us) + base.sample_gap_us
    needed = int(files.window_nbytes(lo, hi) * WINDOW_READ_PER_EVENT_BYTE)
    if needed > context.event_budget:
        one_file = int(files.reaching(lo, hi).sum()) == 1
        raise WindowNotDrawn(
            f"This window's events take about {size_text(needed)} to read, more than the "
            f"server's event budget ({size_text(context.event_budget)}, --event-budget-mb): "
            + ("they are in one file, which only a larger budget reads." if one_file
               else "drag a narrower range on the overview."))
    try:
        # One window read at a time in this process: the budget bounds the process, not a request.
        with _WINDOW_READS:
            trial = window_files.read_window(files, lo, hi, roots=context.roots, s3_buckets=context.s3_buckets,
                                             file_cache=context.cache.files)
    except (TrialError, OSError) as exc:  # its files gone or changed since, or S3 failing
        log.warning("reading the window's files of %s failed: %s", files.path, exc)
        raise WindowNotDrawn(f"Reading the window's files failed ({type(exc).__name__}: {exc}).") from exc
    trial = window_files.window_part(files, trial, node or None)
    return views.window_payload_of(base, trial, lambda chosen: batches[chosen["key"]], start_us, end_us,
                                   select_events, select_dimensions, loader, selected)


def _query(search: str | None) -> dict:
    return {k: v[-1] for k, v in parse_qs((search or "").lstrip("?")).items() if v}


# Every finding's "show" buttons (their ids carry the window to show).
SHOW_WINDOW_BUTTONS = {"type": Ids.SHOW_WINDOW, "index": ALL, "start_us": ALL, "end_us": ALL}
# Every finding's "try in what-if" buttons (their ids carry the change and its loader).
TRY_WHAT_IF_BUTTONS = {"type": Ids.TRY_WHAT_IF, "index": ALL, "change": ALL, "loader": ALL}
# The what-if's fields, in the order of views.WHAT_IF_KEYS.
WHAT_IF_FIELDS = [Ids.WHAT_IF_WORKERS, Ids.WHAT_IF_PREFETCH, Ids.WHAT_IF_IN_ORDER, Ids.WHAT_IF_PERSISTENT]


# Each outlier table's panel in views.panels().
TABLE_PANELS = dict(zip(OUTLIER_TABLES, ("init", "workers", "getnext", "batchtime")))
CSV_BUTTONS = [csv_button(table) for table in OUTLIER_TABLES]


def listing_key(context: Context, path: str) -> str:
    """The key a load of `path` would have now (cache.trial_key of its listing): one listing,
    no file read. A follow tick compares it with the key shown."""
    store = open_store(path, roots=context.roots, s3_buckets=context.s3_buckets)
    return trial_key(store.canonical_path, fingerprint(store.list()))


def newest_window(span: tuple[int, int], minutes) -> tuple[int, int] | None:
    """The last `minutes` of the trial (None when minutes is not a positive number)."""
    try:
        minutes = float(minutes)
    except (TypeError, ValueError):
        return None
    if not minutes > 0:
        return None
    return max(span[0], span[1] - int(minutes * 60e6)), span[1]


def _shown_window(trigger, clicks) -> tuple[int, int] | None:
    """The window a clicked "show" button names (None for a button just drawn, not clicked)."""
    if not clicks:
        return None
    try:
        return int(trigger["start_us"]), int(trigger["end_us"])
    except (KeyError, TypeError, ValueError):
        return None


def _rank_waits(context: Context, key: str):
    """The per-rank summaries of a loaded trial (analysis.ranks), once per trial; None when the
    trial is no longer in the cache. The trial itself is read only when they are not kept."""
    try:
        check_held(context, key)
        return context.cache.page_part(f"rank-waits:{key}",
                                       lambda: ranks.rank_waits(whole_trial(context, key).framework))
    except TrialEvicted:
        return None


# The parts of the panels drawn from a view of the trial (or of a node): page_part names.
VIEW_PARTS = (("panels", views.panels), ("verdict", views.verdict_summary), ("budget", views.budget_view))


def node_options_part(context: Context, key: str) -> list[dict]:
    return context.cache.page_part(f"node-options:{key}", lambda: views.node_options(whole_trial(context, key)))


def view_part(context: Context, key: str, node: str, name: str, draw):
    return context.cache.page_part(f"{name}:{key}:{node}", lambda: draw(get_view(context, key, node)))


def summary_part(context: Context, key: str) -> dict:
    return context.cache.page_part(f"summary:{key}", lambda: views.summary(whole_trial(context, key)))


def first_window_part(context: Context, key: str, node: str | None, start_us: int, end_us: int, draw) -> dict:
    """The window a page opens with (views.first_window), drawn by draw() once."""
    return context.cache.page_part(f"window:{key}:{node or ''}:{start_us}:{end_us}", draw)


def draw_first_page(context: Context, key: str, nodes, span: tuple[int, int]) -> None:
    """Draws what a page of the trial first shows (for each of `nodes`: the panels, the window
    of the whole job; and the trial's summary, hosts and ranks) and keeps it, as the page's own
    callbacks would. The load job runs it in its own process, which holds the trial already and
    whose memory goes with it: the server process then shows the page from these parts and never
    holds the whole trial (a cold 3M-GetNext trial's first page left it at 1.7 GB)."""
    node_options_part(context, key)
    summary_part(context, key)
    _rank_waits(context, key)
    over_budget = _over_budget(context, key) is not None
    for node in nodes:
        node = node or ""
        for name, draw in VIEW_PARTS:
            view_part(context, key, node, name, draw)
        first_window_part(context, key, node, *span,
                          lambda node=node: draw_window(context, key, node, *span, ".*", ".*", None, None))
        if over_budget:  # every loader a window may draw the batches of
            view = get_view(context, key, node)
            for row in views.budget_rows(view):
                keep_loader_batches(context, key, node, view, row)


def register_callbacks(app, context: Context) -> None:
    @app.callback(Output(Ids.LOAD_REQUEST, "data"), Output(Ids.TRIAL_PATH, "value"),
                  Input(Ids.URL, "search"), Input(Ids.LOAD, "n_clicks"), Input(Ids.REFRESH, "n_clicks"),
                  Input(Ids.TRIAL_PATH, "n_submit"), Input(Ids.FOLLOW_INTERVAL, "n_intervals"),
                  State(Ids.TRIAL_PATH, "value"), State(Ids.TRIAL_STORE, "data"))
    def request_load(search, _load, _refresh, _submit, _tick, typed, current):
        trigger = ctx.triggered_id
        if trigger == Ids.FOLLOW_INTERVAL:
            # Following: a refresh only when the listing changed (a new or changed file); the
            # refresh then reads only those files (the file cache).
            if not current or not current.get("path") or not current.get("key"):
                return no_update, no_update
            try:
                if listing_key(context, current["path"]) == current["key"]:
                    return no_update, no_update
            except TrialError:  # gone for a moment (S3 throttling, a rotation): the next tick sees
                return no_update, no_update
            except Exception as exc:  # noqa: BLE001
                _unexpected("Following the trial", exc)
                return no_update, no_update
            return {"path": current["path"], "refresh": True, "follow": True, "nonce": time.time()}, no_update
        if trigger in (None, Ids.URL):  # the page was opened (or history moved): the URL's state
            query = _query(search)
            path = query.get("trial") or context.default_trial
            window = views.time_window(query.get("start"), query.get("end"))
            return {"path": path, "window": window, "node": query.get("node", ""), "nonce": time.time()}, path
        if trigger == Ids.REFRESH and current and current.get("path"):
            return {"path": current["path"], "refresh": True, "nonce": time.time()}, no_update
        return {"path": (typed or "").strip(), "nonce": time.time()}, no_update

    @app.callback(Output(Ids.TRIAL_STORE, "data"), Output(Ids.ERROR, "children"),
                  Input(Ids.LOAD_REQUEST, "data"),
                  background=True, prevent_initial_call=True, interval=250,
                  progress=[Output(Ids.PROGRESS, "value"), Output(Ids.PROGRESS, "max"),
                            Output(Ids.STATUS, "children")],
                  progress_default=["0", "1", ""],
                  running=[(Output(Ids.LOAD, "disabled"), True, False),
                           (Output(Ids.REFRESH, "disabled"), True, False),
                           (Output(Ids.PROGRESS_WRAP, "className"), "progress", "progress hidden")])
    def load(set_progress, request):
        path = (request or {}).get("path") or ""
        last = [0.0]

        def listed(count):
            set_progress(("0", "1", f"Listed {count:,} files; reading…"))

        def waiting():
            set_progress(("0", "1", "Another load is reading this trial; waiting for it…"))

        def progress(done, total):
            now = time.monotonic()
            if done == total or now - last[0] >= PROGRESS_EVERY_S:
                last[0] = now
                set_progress((str(done), str(total), f"Read {done:,} of {total:,} files"))

        try:
            if not path:
                return no_update, "Type a trial path (a local folder or s3://bucket/prefix) and press Load."
            set_progress(("0", "1", f"Listing {path}…"))
            node = request.get("node") or ""
            parts = [None, node] if node else [None]
            listing = context.cache.listing(path, roots=context.roots, s3_buckets=context.s3_buckets,
                                            on_listed=listed)
            key = listing[0]
            span, cached, not_kept = context.cache.ready(key, parts), True, None
            if span is None:  # (else the page reads what it needs from the cache itself)
                key, trial, cached = context.cache.load(path, roots=context.roots, s3_buckets=context.s3_buckets,
                                                        on_progress=progress, on_wait=waiting, listed=listing,
                                                        max_bytes=context.max_bytes, max_events=context.max_events)
                set_progress(("1", "1", "Analyzing…"))
                for part in parts:
                    context.cache.analyses(key, trial, part)
                keep_trial_files(context, key, trial, listing[2])
                span, not_kept = (trial.start_us, trial.end_us), context.cache.not_kept()
                if not_kept is None and trial.report.complete:
                    set_progress(("1", "1", "Drawing the page…"))
                    try:
                        draw_first_page(context, key, parts, span)
                    except Exception:  # noqa: BLE001 - the page's callbacks draw it, and say what fails
                        log.exception("drawing the first page of %s in its load failed", path)
        except TrialError as exc:
            return no_update, views.load_error_text(exc)
        except Exception as exc:  # noqa: BLE001 - the page gets a message, the log the traceback
            return no_update, _unexpected(f"Loading {path}", exc)
        # The URL shows the path in its one spelling: opened again, it names the same trial.
        return {"path": trial_spelling(path), "key": key, "start_us": span[0], "end_us": span[1],
                "window": _requested_window(request.get("window")), "node": request.get("node"),
                "from_cache": cached, "loaded": views.now_iso(), "nonce": _echoed_nonce(request.get("nonce"))}, (
                    f"The server's cache could not keep this trial ({not_kept}): it is shown, and read "
                    f"again when needed." if not_kept else "")

    panel_outputs = [
        Output(Ids.SUMMARY_VERDICT, "children"), Output(Ids.SUMMARY_FINDINGS, "children"),
        Output(Ids.SUMMARY_FACTS, "children"), Output(Ids.BUDGET_GRAPH, "figure"), Output(Ids.BUDGET_NOTE, "children"),
        Output(Ids.BUDGET, "className"), Output(Ids.WHAT_IF, "className"), Output(Ids.WHAT_IF_LOADER, "options"),
        Output(Ids.WHAT_IF_LOADER, "value"), Output(Ids.WHAT_IF_LOADER_WRAP, "className"),
        Output(Ids.NODE, "options"), Output(Ids.NODE, "value"),
        Output(Ids.INIT_COUNT, "children"), Output(Ids.INIT_MEDIAN, "children"), Output(Ids.INIT_MAX, "children"),
        Output(Ids.INIT_ITERATORS, "rowData"), Output(Ids.INIT_GRAPH, "figure"),
        Output(Ids.INIT_OUTLIER_COUNT, "children"), Output(Ids.INIT_OUTLIERS, "rowData"),
        Output(Ids.INIT_NOTE, "children"), Output(Ids.WORKERS_NOTE, "children"),
        Output(Ids.WORKERS_COUNT, "children"), Output(Ids.WORKERS_MEDIAN, "children"),
        Output(Ids.WORKERS_MAX, "children"), Output(Ids.WORKERS_GRAPH, "figure"),
        Output(Ids.WORKERS_OUTLIER_COUNT, "children"), Output(Ids.WORKERS_OUTLIERS, "rowData"),
        Output(Ids.GETNEXT_COUNT, "children"), Output(Ids.GETNEXT_MEDIAN, "children"),
        Output(Ids.GETNEXT_MAX, "children"), Output(Ids.GETNEXT_HISTOGRAM, "figure"),
        Output(Ids.GETNEXT_TIMELINE, "figure"), Output(Ids.GETNEXT_OUTLIER_COUNT, "children"),
        Output(Ids.GETNEXT_OUTLIERS, "rowData"),
        Output(Ids.BATCH_COUNT, "children"), Output(Ids.BATCH_MEDIAN, "children"),
        Output(Ids.BATCH_GRAPH, "figure"), Output(Ids.BATCH_OUTLIER_COUNT, "children"),
        Output(Ids.BATCH_OUTLIERS, "rowData"),
        Output(Ids.INIT_BODY, "className"), Output(Ids.WORKERS_BODY, "className"),
        *[Output(t, "selectedRows") for t in OUTLIER_TABLES],
        Output(Ids.ERROR, "children", allow_duplicate=True),
    ]

    @app.callback(*panel_outputs, Input(Ids.TRIAL_STORE, "data"), Input(Ids.NODE, "value"),
                  prevent_initial_call=True)
    def show_trial(store, node):
        if not store or not store.get("key"):
            return [no_update] * len(panel_outputs)
        key = store["key"]
        try:
            check_held(context, key)
            # Drawn once and kept on the disk (cache.page_part): a warm trial's page reads no trial back.
            options = node_options_part(context, key)
            if ctx.triggered_id == Ids.TRIAL_STORE and store.get("node") is not None:
                node = store.get("node") or ""
            if node not in {o["value"] for o in options}:
                node = ""

            p, verdict, budget = (view_part(context, key, node, name, draw) for name, draw in VIEW_PARTS)
            summary = summary_part(context, key)
        except TrialEvicted:
            return [no_update] * (len(panel_outputs) - 1) + [EVICTED]
        except Exception as exc:  # noqa: BLE001
            return [no_update] * (len(panel_outputs) - 1) + [_unexpected("Showing the trial", exc)]
        init, workers, getnext, batch = p["init"], p["workers"], p["getnext"], p["batchtime"]
        parts = summary_parts(summary, verdict)
        return [
            parts["verdict"], parts["findings"], parts["facts"], budget["figure"], budget["note"], "budget",
            "what-if" if budget["rows"] else "what-if hidden", budget["loader_options"], "",
            "what-if-loader" if budget["several_loaders"] else "what-if-loader hidden",
            options, node,
            init["count"], init["median_us"], init["max_us"], init["iterators"], init["figure"],
            init["outlier_count"], init["outliers"], init["note"], workers["note"],
            workers["count"], workers["median_us"], workers["max_us"], workers["figure"],
            workers["outlier_count"], workers["outliers"],
            getnext["count"], getnext["median_us"], getnext["max_us"], getnext["histogram"],
            getnext["timeline"], getnext["outlier_count"], getnext["outliers"],
            batch["count"], batch["median_s"], batch["figure"], batch["outlier_count"], batch["outliers"],
            *[views.panel_body_class(panel) for panel in (init, workers)],
            *[[] for _ in OUTLIER_TABLES],
            no_update,
        ]

    @app.callback(Output(Ids.WINDOW_STORE, "data"),
                  Input(Ids.TRIAL_STORE, "data"), Input(Ids.OVERVIEW, "relayoutData"),
                  Input(Ids.OVERVIEW, "selectedData"),
                  Input(Ids.WINDOW_GRAPH, "relayoutData"), Input(Ids.WHOLE_JOB, "n_clicks"),
                  *[Input(t, "selectedRows") for t in OUTLIER_TABLES], Input(SHOW_WINDOW_BUTTONS, "n_clicks"),
                  Input(Ids.BUDGET_GRAPH, "clickData"), Input(Ids.RANK_HEATMAP, "clickData"),
                  Input(Ids.FOLLOW_WINDOW, "value"),
                  State(Ids.WINDOW_STORE, "data"), prevent_initial_call=True)
    def set_window(store, overview_relayout, overview_selected, window_relayout, _whole, *rest):
        # The tables' selections, the "show" buttons' clicks, a click on the budget, whether the
        # window follows the newest minutes, the window.
        selections, budget_click, rank_click, newest, current = (rest[:len(OUTLIER_TABLES)], rest[-4], rest[-3],
                                                                  rest[-2], rest[-1])
        if not store or not store.get("key") or store.get("start_us") is None:
            return no_update
        span = (int(store["start_us"]), int(store["end_us"]))
        trigger = ctx.triggered_id
        chosen, widened = None, False
        # The outlier a user chose stays marked, whatever the window, until another is chosen.
        selected = current.get("selected") if current and current.get("key") == store["key"] else None
        try:
            # A newly loaded trial gets its first window, whatever else triggered this call: a
            # request superseded by a newer one reports only the newer one's triggers.
            if not current or current.get("key") != store["key"]:
                if current and current.get("path") == store["path"]:
                    # A refresh (or a follow tick) keeps the window, unless it follows the newest minutes.
                    chosen = newest_window(span, newest) or (current["start_us"], current["end_us"])
                elif store.get("window"):
                    chosen = tuple(store["window"])  # the URL's window
                else:
                    chosen = span
            elif trigger == Ids.OVERVIEW and views.selection_cleared(ctx.triggered, Ids.OVERVIEW, overview_selected):
                chosen = span  # a double-click on the overview (a box select's "deselect"): the whole job
            elif trigger in (Ids.OVERVIEW, Ids.WINDOW_GRAPH):
                found = views.relayout_range(overview_relayout if trigger == Ids.OVERVIEW else window_relayout)
                if found == "full":  # a double-click: the whole job
                    chosen = span
                elif found is not None:
                    chosen, widened = views.drag_window(found)
            elif trigger == Ids.WHOLE_JOB:
                chosen = span
            elif trigger in OUTLIER_TABLES:
                row = views.selected_row(selections[OUTLIER_TABLES.index(trigger)])
                if row is not None:
                    chosen = views.outlier_window(int(row["start_us"]), int(row["end_us"]))
                    selected = views.selected_mark(row)
            elif isinstance(trigger, dict) and trigger.get("type") == Ids.SHOW_WINDOW:
                chosen = _shown_window(trigger, ctx.triggered[0]["value"] if ctx.triggered else None)
            elif trigger == Ids.RANK_HEATMAP:
                cell = views.rank_cell(rank_click, _rank_waits(context, store["key"]))
                chosen = cell[1:] if cell is not None else None
            elif trigger == Ids.BUDGET_GRAPH:
                chosen = views.budget_click_window(budget_click)  # None: a part without a window
            elif trigger == Ids.FOLLOW_WINDOW:
                chosen = newest_window(span, newest)  # None: "window stays"
        except Exception as exc:  # noqa: BLE001 - a bad event never breaks the page
            _unexpected("Setting the window", exc)
            return no_update
        if chosen is None or chosen[1] <= chosen[0]:
            return no_update
        start, end = int(chosen[0]), int(chosen[1])
        if (current and current.get("key") == store["key"] and (current["start_us"], current["end_us"]) == (start, end)
                and current.get("selected") == selected):
            # A drag widened to this very window: plotly has zoomed its axis to its own range
            # meanwhile, so the window is drawn again (a new value of the store), not left unsaid.
            return {**current, "drawn": time.time_ns()} if widened else no_update
        return {"key": store["key"], "path": store["path"], "start_us": start, "end_us": end,
                "start": views.iso_utc(start), "end": views.iso_utc(end), "selected": selected}

    @app.callback(Output(Ids.WINDOW_GRAPH, "figure"), Output(Ids.OVERVIEW, "figure"),
                  Output(Ids.WINDOW_RANGE, "children"), Output(Ids.WINDOW_ERROR, "children"),
                  Input(Ids.WINDOW_STORE, "data"), Input(Ids.SELECT_EVENTS, "value"),
                  Input(Ids.SELECT_DIMENSIONS, "value"), Input(Ids.NODE, "value"),
                  Input(Ids.WHAT_IF_LOADER, "value"),
                  State(Ids.TRIAL_STORE, "data"), prevent_initial_call=True)
    def show_window(window, select_events, select_dimensions, node, loader, store):
        if not window or not store or window.get("key") != store.get("key"):
            return no_update, no_update, no_update, no_update
        try:
            views.check_patterns(select_events, select_dimensions)
        except ValueError as exc:  # an invalid regular expression: say so, keep the figures
            return no_update, no_update, views.window_text(window["start_us"], window["end_us"]), str(exc)
        key, start, end = store["key"], window["start_us"], window["end_us"]

        def draw() -> dict:
            return draw_window(context, key, node, start, end, select_events, select_dimensions, loader,
                               window.get("selected"))

        try:
            check_held(context, key)
            if views.first_window(store, window, select_events, select_dimensions, loader):
                # The window a page opens with: drawn once and kept on the disk, as the panels.
                payload = first_window_part(context, key, node, start, end, draw)
            else:
                payload = draw()
        except TrialEvicted:
            return no_update, no_update, no_update, EVICTED
        except WindowNotDrawn as exc:  # the figures and their range text stay as they were
            return no_update, no_update, no_update, str(exc)
        except Exception as exc:  # noqa: BLE001
            return no_update, no_update, no_update, _unexpected("Drawing the window", exc)
        return payload["window_figure"], payload["overview_figure"], payload["window_range"], ""

    @app.callback(Output(Ids.WHAT_IF_GRAPH, "figure"), Output(Ids.WHAT_IF_RESULT, "children"),
                  Output(Ids.WHAT_IF_ERROR, "children"),
                  *[Input(field, "value") for field in WHAT_IF_FIELDS], Input(Ids.WHAT_IF_LOADER, "value"),
                  Input(Ids.TRIAL_STORE, "data"), Input(Ids.NODE, "value"), prevent_initial_call=True)
    def what_if(workers, prefetch, in_order, persistent, loader, store, node):
        if not store or not store.get("key"):
            return no_update, no_update, no_update
        change = views.what_if_change(workers, prefetch, in_order, persistent)
        try:
            assessment = get_assessment(context, store["key"], node)
            try:
                # A replay per loader: each change once per trial, node and loader (a field
                # fires on every keystroke, and users go back and forth).
                name = f"what-if:{store['key']}:{node or ''}:{loader or ''}:{sorted(change.items())}"
                shown = context.cache.memo(name, lambda: views.what_if_view_of(assessment, change, loader))
                message = ""
            except ValueError as exc:  # a bad setting: the library's words; today's bars only
                shown, message = views.what_if_view_of(assessment, {}, loader), str(exc)
        except TrialEvicted:
            return no_update, no_update, EVICTED
        except Exception as exc:  # noqa: BLE001
            return no_update, no_update, _unexpected("The what-if", exc)
        return shown["figure"], what_if_lines(shown), message

    @app.callback(*[Output(field, "value", allow_duplicate=True) for field in WHAT_IF_FIELDS],
                  Output(Ids.WHAT_IF_LOADER, "value", allow_duplicate=True),
                  Input(TRY_WHAT_IF_BUTTONS, "n_clicks"), prevent_initial_call=True)
    def try_what_if(_clicks):
        trigger = ctx.triggered_id
        if not isinstance(trigger, dict) or not (ctx.triggered and ctx.triggered[0]["value"]):
            return [no_update] * (len(WHAT_IF_FIELDS) + 1)  # buttons drawn, not clicked
        try:
            fields = views.what_if_inputs(parse_what_if(trigger.get("change", "")))
        except ValueError:
            return [no_update] * (len(WHAT_IF_FIELDS) + 1)
        return [fields[key] for key in views.WHAT_IF_KEYS] + [trigger.get("loader", "")]

    # The URL follows the state without reloading or adding history entries, so a copied
    # link opens the same trial, node and window.
    app.clientside_callback(
        """
        function(trial, win, node, compared) {
            if (!trial || !trial.path) { return window.dash_clientside.no_update; }
            const enc = (v) => encodeURIComponent(v).replace(/%2F/g, '/').replace(/%3A/g, ':');
            let query = '?trial=' + enc(trial.path);
            if (win && win.key === trial.key) { query += '&start=' + enc(win.start) + '&end=' + enc(win.end); }
            if (node) { query += '&node=' + enc(node); }
            if (compared && compared.path) { query += '&compare=' + enc(compared.path); }
            if (window.location.search !== query) {
                window.history.replaceState(window.history.state, '', window.location.pathname + query);
            }
            return query;
        }
        """,
        Output(Ids.URL_SYNC, "data"), Input(Ids.TRIAL_STORE, "data"), Input(Ids.WINDOW_STORE, "data"),
        Input(Ids.NODE, "value"), Input(Ids.COMPARE_STORE, "data"))

    # Inspecting an outlier or a finding's evidence: bring the timeline into view (not when a
    # table is cleared or new "show" buttons are drawn).
    app.clientside_callback(
        """
        function() {
            const triggered = window.dash_clientside.callback_context.triggered || [];
            // A click on the budget shows a window only where its part has one (customdata[2]).
            const shows = (t) => t.prop_id.startsWith('%s.') ?
                Boolean(t.value && t.value.points && t.value.points.length && t.value.points[0].customdata &&
                        t.value.points[0].customdata[2] != null) :
                (Array.isArray(t.value) ? t.value.length : t.value);
            if (triggered.some(shows)) {
                const el = document.getElementById('%s');
                // The sticky header's height (it grows with an error or a second row of
                // controls) is the scroll target's margin (assets: scroll-margin-top).
                const header = document.querySelector('.header');
                if (header) {
                    document.documentElement.style.setProperty(
                        '--header-height', Math.ceil(header.getBoundingClientRect().height) + 'px');
                }
                if (el) { el.scrollIntoView({block: 'start'}); }
            }
            return window.dash_clientside.no_update;
        }
        """ % (Ids.BUDGET_GRAPH, Ids.TIMELINE),
        Output(Ids.TIMELINE, "title"), *[Input(t, "selectedRows") for t in OUTLIER_TABLES],
        Input(SHOW_WINDOW_BUTTONS, "n_clicks"), Input(Ids.BUDGET_GRAPH, "clickData"), prevent_initial_call=True)

    @app.callback(Output(Ids.RANK_HEATMAP, "figure"), Output(Ids.RANKS, "className"), Output(Ids.RANK_NOTE, "children"),
                  Input(Ids.TRIAL_STORE, "data"), Input(Ids.RANK_ORDER, "value"), Input(Ids.WINDOW_STORE, "data"),
                  prevent_initial_call=True)
    def show_ranks(store, order, window):
        if not store or not store.get("key"):
            return no_update, no_update, no_update
        try:
            waits = _rank_waits(context, store["key"])
            if waits is None:
                return no_update, no_update, no_update
            shown = None
            if window and window.get("key") == store["key"]:
                shown = (int(window["start_us"]), int(window["end_us"]))
            view = views.rank_heatmap_view(waits, order, shown)
        except Exception as exc:  # noqa: BLE001 - a bad event never breaks the page
            return no_update, no_update, _unexpected("Drawing the ranks", exc)
        return view["figure"], view["class"], view["note"]

    @app.callback(Output(Ids.NODE, "value", allow_duplicate=True), Input(Ids.RANK_HEATMAP, "clickData"),
                  State(Ids.NODE, "options"), State(Ids.TRIAL_STORE, "data"), prevent_initial_call=True)
    def scope_to_rank(click, options, store):
        """A click on a heat-map cell scopes the page to that cell's process."""
        if not store or not store.get("key"):
            return no_update
        cell = views.rank_cell(click, _rank_waits(context, store["key"]))
        values = {o["value"] for o in options or []}
        if cell is None:
            return no_update
        # The process, or its host when the host has no other (the selector then lists the host only).
        chosen = cell[0] if cell[0] in values else host_of(cell[0])
        return chosen if chosen in values else no_update

    # Which trial the panels show. A load that failed leaves them as they were: say whose they
    # are, so that the path box (the failed path) is not read as theirs.
    app.clientside_callback(
        """
        function(error, store, request) {
            if (!store || !store.path) { return [window.dash_clientside.no_update, 'shown-trial']; }
            const failed = Boolean(error) && request && request.nonce !== store.nonce;
            if (failed) {
                const asked = request.path ? request.path + ' was not loaded. ' : '';
                return [asked + 'The panels below still show the previous trial: ' + store.path,
                        'shown-trial stale'];
            }
            return ['Showing ' + store.path, 'shown-trial'];
        }
        """,
        Output(Ids.SHOWN_TRIAL, "children"), Output(Ids.SHOWN_TRIAL, "className"),
        Input(Ids.ERROR, "children"), Input(Ids.TRIAL_STORE, "data"), State(Ids.LOAD_REQUEST, "data"))

    register_follow_callbacks(app)
    register_download_callbacks(app, context)
    register_compare_callbacks(app, context)


# --- following a running job ---------------------------------------------------------------------

def follow_state(on: bool, hidden: bool, trigger, store: dict | None, state: dict | None, now: float,
                 idle_s: float = None) -> tuple[bool, dict, str, bool]:
    """What following does now: (interval disabled, state, note, still on). The state keeps the
    key last shown and when it last changed; following stops after idle_s without a change
    (seconds counted while the tab is visible)."""
    idle_s = FOLLOW_IDLE_S if idle_s is None else idle_s
    state = dict(state or {})
    key = (store or {}).get("key")
    if trigger == Ids.FOLLOW or trigger == Ids.VISIBILITY or key != state.get("key") or "changed_at" not in state:
        state.update(key=key, changed_at=now)  # switched on, back in view, or the trial changed
    if not on:
        return True, state, "", False
    if hidden:
        return True, state, "paused while this tab is hidden", True
    if now - state["changed_at"] > idle_s:
        return True, state, (f"stopped: no file of the trial changed for {idle_s:g} s; switch Follow on to "
                             f"watch again"), False
    return False, state, "following: new files are read every few seconds", True


def register_follow_callbacks(app) -> None:
    # The tab's visibility, kept in a store by the page itself: following pauses while hidden.
    app.clientside_callback(
        """
        function(_) {
            if (!window._dataloaderVisibility) {
                window._dataloaderVisibility = true;
                document.addEventListener('visibilitychange', function() {
                    window.dash_clientside.set_props('%s', {data: document.visibilityState});
                });
            }
            return document.visibilityState;
        }
        """ % Ids.VISIBILITY,
        Output(Ids.VISIBILITY, "data"), Input(Ids.URL, "pathname"))

    @app.callback(Output(Ids.FOLLOW_INTERVAL, "disabled"), Output(Ids.FOLLOW_STATE, "data"),
                  Output(Ids.FOLLOW_NOTE, "children"), Output(Ids.FOLLOW, "value"),
                  Input(Ids.FOLLOW, "value"), Input(Ids.VISIBILITY, "data"), Input(Ids.FOLLOW_INTERVAL, "n_intervals"),
                  Input(Ids.TRIAL_STORE, "data"), State(Ids.FOLLOW_STATE, "data"), prevent_initial_call=True)
    def follow(value, visibility, _tick, store, state):
        on = "on" in (value or [])
        disabled, state, note, still_on = follow_state(on, visibility == "hidden", ctx.triggered_id, store, state,
                                                       time.time())
        return disabled, state, note, (no_update if still_on == on else [])


# --- downloads -------------------------------------------------------------------------------------

def register_download_callbacks(app, context: Context) -> None:
    @app.callback(Output(Ids.DOWNLOAD, "data"), Output(Ids.ERROR, "children", allow_duplicate=True),
                  *[Input(button, "n_clicks") for button in CSV_BUTTONS], Input(Ids.EXPORT_JSON, "n_clicks"),
                  Input(Ids.EXPORT_TRACE, "n_clicks"), State(Ids.TRIAL_STORE, "data"), State(Ids.NODE, "value"),
                  State(Ids.WINDOW_STORE, "data"), State(Ids.SELECT_EVENTS, "value"),
                  State(Ids.SELECT_DIMENSIONS, "value"), prevent_initial_call=True)
    def download(*args):
        store, node, window, select_events, select_dimensions = args[-5:]
        trigger = ctx.triggered_id
        if not (ctx.triggered and ctx.triggered[0]["value"]) or not store or not store.get("key"):
            return no_update, no_update
        node = node or ""
        try:
            view = get_view(context, store["key"], node)
            path = store["path"] + (f"-{node}" if node else "")
            if trigger in CSV_BUTTONS:
                table = OUTLIER_TABLES[CSV_BUTTONS.index(trigger)]
                rows = context.cache.page_part(f"panels:{store['key']}:{node}",
                                               lambda: views.panels(view))[TABLE_PANELS[table]]["outliers"]
                return dcc.send_string(views.outlier_csv(rows), views.download_name(path, table, ".csv"),
                                       type="text/csv"), ""
            if trigger == Ids.EXPORT_JSON:
                return dcc.send_string(views.analysis_json(view), views.download_name(path, "analysis", ".json"),
                                       type="application/json"), ""
            if trigger == Ids.EXPORT_TRACE:
                if not window or window.get("key") != store["key"]:
                    return no_update, "Choose a window on the timeline first."
                start, end = int(window["start_us"]), int(window["end_us"])
                try:
                    text = views.window_trace_json(view, start, end, select_events, select_dimensions)
                except ValueError as exc:  # an invalid filter: the window's own message
                    return no_update, str(exc)
                return dcc.send_string(text, views.download_name(path, f"window-{start}-{end}", ".json"),
                                       type="application/json"), ""
        except TrialEvicted:
            return no_update, EVICTED
        except Exception as exc:  # noqa: BLE001
            return no_update, _unexpected("The download", exc)
        return no_update, no_update


# --- two runs compared --------------------------------------------------------------------------

def register_compare_callbacks(app, context: Context) -> None:
    @app.callback(Output(Ids.COMPARE_REQUEST, "data"), Output(Ids.COMPARE_PATH, "value"),
                  Input(Ids.URL, "search"), Input(Ids.COMPARE, "n_clicks"), Input(Ids.COMPARE_PATH, "n_submit"),
                  State(Ids.COMPARE_PATH, "value"))
    def request_compare(search, _clicks, _submit, typed):
        if ctx.triggered_id in (None, Ids.URL):
            path = _query(search).get("compare", "")
            if not path:
                return no_update, no_update
            return {"path": path, "nonce": time.time()}, path
        return {"path": (typed or "").strip(), "nonce": time.time()}, no_update

    @app.callback(Output(Ids.COMPARE_STORE, "data"), Output(Ids.COMPARE_ERROR, "children"),
                  Input(Ids.COMPARE_REQUEST, "data"), background=True, prevent_initial_call=True, interval=250,
                  running=[(Output(Ids.COMPARE, "disabled"), True, False)])
    def load_compare(request):
        path = (request or {}).get("path") or ""
        if not path:
            return None, ""  # an empty path ends the comparison
        try:
            key, trial, _ = context.cache.load(path, roots=context.roots, s3_buckets=context.s3_buckets,
                                               max_bytes=context.max_bytes, max_events=context.max_events)
            context.cache.analyses(key, trial, None)
        except TrialError as exc:
            return no_update, views.load_error_text(exc)
        except Exception as exc:  # noqa: BLE001
            return no_update, _unexpected(f"Loading {path}", exc)
        return {"path": path, "key": key, "nonce": _echoed_nonce(request.get("nonce"))}, ""

    @app.callback(Output(Ids.COMPARE_SECTION, "className"), Output(Ids.COMPARE_BODY, "children"),
                  Output(Ids.COMPARE_ERROR, "children", allow_duplicate=True),
                  Input(Ids.TRIAL_STORE, "data"), Input(Ids.COMPARE_STORE, "data"), prevent_initial_call=True)
    def show_compare(store, compared):
        if not compared or not compared.get("key"):
            return "panel compare hidden", [], no_update
        if not store or not store.get("key"):
            return no_update, no_update, no_update
        try:
            view_a, view_b = get_view(context, store["key"], None), get_view(context, compared["key"], None)
            data = context.cache.memo(f"compare:{store['key']}:{compared['key']}", lambda: compare_page.compare_data(
                view_a, view_b, compare(Side(view_a.assessment, view_a.trial.framework),
                                        Side(view_b.assessment, view_b.trial.framework))))
        except TrialEvicted:
            return no_update, no_update, EVICTED
        except Exception as exc:  # noqa: BLE001
            return no_update, no_update, _unexpected("Comparing the trials", exc)
        return "panel compare", compare_page.compare_component(data, Ids), ""
