"""Building and serving the Dash app, from command-line options or DASHBOARD_* variables.

    python app.py serve --trial s3://bucket/job/profiler-output --cache-dir /var/cache/dash
    DASHBOARD_CACHE_DIR=/var/cache/dash gunicorn --worker-class dashboard.serving.BufferingWorker -w 4 app:server

Every server process (and every gunicorn worker) given the same cache folder shares the
loaded trials and the background-callback jobs, and the --max-loads places they run in
(jobs.py). The Dash debugger is off unless a developer passes --dev-debug.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import ipaddress
import logging
import os
import secrets
from dataclasses import dataclass, field

import dash
import flask
from dash.exceptions import BackgroundCallbackError

from ..serving import MAX_REQUEST_BYTES, listening_hosts
from ..trial.private_files import PRIVATE_FILE
from .cache import JOBS_FOLDER, ForkSafeCache, TrialCache, default_cache_dir
from .callbacks import Context, log_text, queued_progress, register_callbacks
from .jobs import ENDED_WITHOUT_RESULT, QueueingManager
from .layout import Ids, build_layout
from .options import (DEFAULT_EVENT_BUDGET_MB, DEFAULT_MAX_EVENTS, DEFAULT_MAX_FILES, DEFAULT_MAX_TRIAL_MB, MB,
                      default_max_loads, limit)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE_TRIAL = os.path.join(REPO_ROOT, "examples", "sample-trial", "trial")
ASSETS = os.path.join(REPO_ROOT, "assets")
TITLE = "DataLoader Profiler"
# A page served on loopback answers only to loopback names: a web page elsewhere that points its
# own name at 127.0.0.1 (DNS rebinding) otherwise reads the dashboard from the visitor's browser.
LOOPBACK_HOSTS = ["localhost", "127.0.0.1", "[::1]", "::1"]
ANY_HOST = "*"
# Dash's renderer evaluates code (clientside callbacks, plotly.js) and sets inline styles: scripts
# need 'unsafe-eval' and 'unsafe-inline', styles 'unsafe-inline'. Everything comes from this
# server (Dash serves its bundles locally); no page may frame it (clickjacking).
CONTENT_SECURITY_POLICY = ("default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; "
                           "style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; font-src 'self' data:; "
                           "connect-src 'self'; worker-src 'self' blob:; object-src 'none'; base-uri 'self'; "
                           "form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Frame-Options": "DENY",
                    "X-Content-Type-Options": "nosniff"}

log = logging.getLogger("dashboard.web")


@dataclass
class ServerOptions:
    trial: str | None = None
    host: str = "127.0.0.1"
    port: int = 8050
    cache_dir: str | None = None
    cache_size_mb: int = 2048
    data_roots: list[str] = field(default_factory=list)
    s3_buckets: list[str] | None = None
    dev_debug: bool = False
    max_trial_mb: int = DEFAULT_MAX_TRIAL_MB  # 0: no limit
    max_events: int = DEFAULT_MAX_EVENTS  # 0: no limit
    max_files: int = DEFAULT_MAX_FILES  # 0: no limit
    event_budget_mb: int = DEFAULT_EVENT_BUDGET_MB  # 0: none (every trial held whole)
    # Background loads run at once, by every server process of the cache folder; 0: no limit.
    max_loads: int = field(default_factory=default_max_loads)
    # Host header names answered ('*': any); None: the loopback names when `host` is a loopback
    # address, else any.
    allowed_hosts: list[str] | None = None

    @property
    def max_bytes(self) -> int | None:
        return self.max_trial_mb * MB if self.max_trial_mb else None

    @property
    def max_events_limit(self) -> int | None:
        return self.max_events or None

    @property
    def max_files_limit(self) -> int | None:
        return self.max_files or None

    @property
    def event_budget_bytes(self) -> int | None:
        return self.event_budget_mb * MB if self.event_budget_mb else None

    def host_allow_list(self) -> list[str] | None:
        """The Host names requests may carry; None: any."""
        hosts = self.allowed_hosts if self.allowed_hosts is not None else _default_hosts([self.host])
        return None if ANY_HOST in hosts else list(hosts)

    @property
    def default_trial(self) -> str:
        return self.trial or SAMPLE_TRIAL

    def allowed_roots(self) -> list[str]:
        """Local folders trials may be opened from: the configured roots (default: the
        working directory), plus the bundled sample and the trial opened at start."""
        roots = list(self.data_roots) or [os.getcwd()]
        roots.append(os.path.dirname(SAMPLE_TRIAL))
        if self.trial and not self.trial.startswith("s3://"):
            roots.append(self.trial)
        return [os.path.abspath(os.path.expanduser(r)) for r in roots]


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name
        return False


def options_from_args(args) -> ServerOptions:
    return ServerOptions(trial=args.trial, host=args.host, port=args.port, cache_dir=args.cache_dir,
                         cache_size_mb=args.cache_size_mb, data_roots=list(args.data_root or []),
                         s3_buckets=args.s3_bucket, dev_debug=bool(args.dev_debug),
                         max_trial_mb=args.max_trial_mb, max_events=args.max_events,
                         max_files=args.max_files, event_budget_mb=args.event_budget_mb,
                         allowed_hosts=args.allowed_host,
                         max_loads=default_max_loads() if args.max_loads is None else args.max_loads)


def _split(value: str | None, sep: str) -> list[str]:
    return [part.strip() for part in (value or "").split(sep) if part.strip()]


def _limit(environ, name: str, default: int) -> int:
    """A size limit from the environment, read as the command line reads one."""
    text = (environ.get(name) or "").strip()
    try:
        return limit(text) if text else default
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _default_hosts(listening: list[str]) -> list[str]:
    """The Host names answered by default under gunicorn: the loopback names where it listens on
    loopback only (as `app.py serve` on its default --host), else any (the app cannot tell which
    names reach it)."""
    return LOOPBACK_HOSTS if listening and all(_is_loopback(host) for host in listening) else [ANY_HOST]


def options_from_environment(environ=None) -> ServerOptions:
    """DASHBOARD_TRIAL, DASHBOARD_CACHE_DIR, DASHBOARD_CACHE_SIZE_MB, DASHBOARD_DATA_ROOTS
    (os.pathsep-separated), DASHBOARD_S3_BUCKETS (comma-separated), DASHBOARD_MAX_TRIAL_MB,
    DASHBOARD_MAX_EVENTS, DASHBOARD_MAX_FILES, DASHBOARD_MAX_LOADS (0: no limit),
    DASHBOARD_EVENT_BUDGET_MB (0: none), DASHBOARD_ALLOWED_HOSTS
    (comma-separated; default: the loopback names where the worker listens on loopback only, else
    any). The debugger is never turned on from the environment."""
    environ = os.environ if environ is None else environ
    buckets = _split(environ.get("DASHBOARD_S3_BUCKETS"), ",")
    hosts = _split(environ.get("DASHBOARD_ALLOWED_HOSTS"), ",")
    return ServerOptions(trial=environ.get("DASHBOARD_TRIAL") or None,
                         cache_dir=environ.get("DASHBOARD_CACHE_DIR") or None,
                         cache_size_mb=int(environ.get("DASHBOARD_CACHE_SIZE_MB") or 2048),
                         data_roots=_split(environ.get("DASHBOARD_DATA_ROOTS"), os.pathsep),
                         s3_buckets=buckets or None,
                         max_trial_mb=_limit(environ, "DASHBOARD_MAX_TRIAL_MB", DEFAULT_MAX_TRIAL_MB),
                         max_events=_limit(environ, "DASHBOARD_MAX_EVENTS", DEFAULT_MAX_EVENTS),
                         max_files=_limit(environ, "DASHBOARD_MAX_FILES", DEFAULT_MAX_FILES),
                         event_budget_mb=_limit(environ, "DASHBOARD_EVENT_BUDGET_MB", DEFAULT_EVENT_BUDGET_MB),
                         max_loads=_limit(environ, "DASHBOARD_MAX_LOADS", default_max_loads()),
                         allowed_hosts=hosts or _default_hosts(listening_hosts()))


def _log_failed_request(exc_info) -> None:
    """In place of Flask's log of a request that raised (a malformed callback request, each one
    a full traceback: a client could flood the log): one line, the traceback at debug level."""
    log.warning("rejected %s %s (HTTP 500): %s: %s", flask.request.method, log_text(flask.request.path),
                type(exc_info[1]).__name__, log_text(str(exc_info[1])))
    log.debug("the traceback of that request", exc_info=exc_info)


# Where the background callbacks (the loads) say that they failed. Their own failures they report
# there themselves; one they cannot is said there too, or the page stopped waiting and said
# nothing: the job's process ended without a result (jobs.ENDED_WITHOUT_RESULT), or a poll of
# it failed (the job store did not answer).
FAILURE_OUTPUTS = {(Ids.ERROR, "children"), (Ids.COMPARE_ERROR, "children")}


def _log_failed_callback(exc: Exception):
    """Dash's error handler: the failure in the log; where the callback has a failure output, its
    message there (the other outputs left unchanged)."""
    log.warning("a callback failed: %s: %s", type(exc).__name__, log_text(str(exc)))
    log.debug("the traceback of that callback", exc_info=exc)
    outputs = dash.callback_context.outputs_list
    listed = outputs if isinstance(outputs, list) else [outputs]
    said = [isinstance(o, dict) and (o.get("id"), o.get("property")) in FAILURE_OUTPUTS for o in listed]
    if not any(said):
        return None
    if isinstance(exc, BackgroundCallbackError) and ENDED_WITHOUT_RESULT in str(exc):
        text = f"The server's process for this request {ENDED_WITHOUT_RESULT}; try again (the server log says more)."
    else:
        text = f"This request failed on the server ({type(exc).__name__}); try again (the server log says more)."
    values = [text if told else dash.no_update for told in said]
    return values if isinstance(outputs, list) else values[0]


def _guard(server: flask.Flask, allowed_hosts: list[str] | None) -> None:
    """The Host check (when allowed_hosts is not None) and the security headers of every response."""
    from werkzeug.sansio.utils import host_is_trusted

    if allowed_hosts is not None:
        @server.before_request
        def check_host():
            host = flask.request.host
            if not host_is_trusted(host, allowed_hosts):
                log.warning("rejected %s %s: Host '%s' is not an allowed host (--allowed-host)",
                            flask.request.method, log_text(flask.request.path), log_text(host))
                return "This server does not answer to that host name.\n", 400, {"Content-Type": "text/plain"}
            return None

    @server.after_request
    def security_headers(response):
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response


SIGNING_SECRET_FILE = "signing-secret"


def shared_signing_secret(cache_dir: str) -> str:
    """The secret every server process of one cache folder signs the background jobs' handles
    with (the page's polls carry them to whichever gunicorn worker they reach): made once, in a
    file of the folder (0600) that appears whole or not at all, the first process's secret kept.

    Dash's own lookup, in the jobs' store at a process's first request, fell back to a secret of
    that process alone when the store did not answer at that moment: a poll reaching another
    worker then found no job, and the page stopped loading without a word. OSError when the
    folder cannot hold it."""
    path = os.path.join(cache_dir, SIGNING_SECRET_FILE)
    if not os.path.exists(path):
        temporary = f"{path}.{secrets.token_hex(8)}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
        try:
            with os.fdopen(descriptor, "w", encoding="ascii") as out:
                out.write(secrets.token_hex(32))
            with contextlib.suppress(FileExistsError):  # another process's came first: it is the one
                os.link(temporary, path)
        finally:
            os.remove(temporary)
    with open(path, encoding="ascii") as found:
        secret = found.read().strip()
    if len(secret) < 32:
        raise OSError(f"{path} is not a signing secret (remove it: the next start makes one)")
    return secret


def create_app(options: ServerOptions) -> dash.Dash:
    cache_dir = os.path.abspath(os.path.expanduser(options.cache_dir or default_cache_dir()))
    trials = TrialCache(cache_dir, options.cache_size_mb, max_files=options.max_files_limit)
    jobs = ForkSafeCache(os.path.join(cache_dir, JOBS_FOLDER))
    manager = QueueingManager(jobs, options.max_loads or None, queued_progress(options.max_loads))
    app = dash.Dash(__name__, title=TITLE, assets_folder=ASSETS, update_title=None,
                    background_callback_manager=manager,
                    suppress_callback_exceptions=False, on_error=_log_failed_callback)
    try:
        app.server.secret_key = shared_signing_secret(cache_dir)
    except OSError as exc:  # (Dash then signs with a secret of its own, per process)
        log.warning("the cache folder cannot keep the background jobs' signing secret (%s): with several "
                    "server processes, a load a poll reaches another process for may stop", exc)
    app.server.log_exception = _log_failed_request
    _guard(app.server, options.host_allow_list())
    # Callback requests are small JSON documents; refuse bodies that could only be abuse.
    app.server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    # A cheap liveness probe for the container's HEALTHCHECK and load balancers.
    app.server.add_url_rule("/healthz", "healthz", lambda: ("ok\n", 200, {"Content-Type": "text/plain"}))
    app.layout = build_layout(options.default_trial)

    @app.server.teardown_request
    def close_cache_connections(_error):
        # The development server runs each connection in a thread of its own, which ends with
        # it: the thread's SQLite connections are closed here, under the fork guard, not left
        # to the cache (it keeps each until a fork closes them all: ForkSafeCache) nor to the
        # thread's end while another thread forks a load (its child then hangs on SQLite's
        # memory mutex; see jobs.py's dispatcher). Threads that stay (gunicorn's) reconnect.
        jobs.close()
        trials.disk.close()

    register_callbacks(app, Context(cache=trials, default_trial=options.default_trial,
                                    roots=options.allowed_roots(), s3_buckets=options.s3_buckets,
                                    max_bytes=options.max_bytes, max_events=options.max_events_limit,
                                    event_budget=options.event_budget_bytes))
    return app


STARTED = ("DataLoader Profiler on {url} (a development server, for one user at a time; "
           "for a shared server, use gunicorn as the README shows)")


def serve(args) -> int:
    options = options_from_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(options)
    if options.dev_debug:
        log.warning("--dev-debug: the Dash debugger is on; anyone who can reach %s:%s can run code",
                    options.host, options.port)
        app.logger.propagate = False  # Dash prints its own line; the root handler would print it again
        # The debugger only ever from the explicit --dev-debug flag (off by default).
        app.run(host=options.host, port=options.port, debug=options.dev_debug)
        return 0
    run_server(app, options.host, options.port)
    return 0


def url_of(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def run_server(app: dash.Dash, host: str, port: int) -> None:
    """Werkzeug's threaded server on the Flask app, without the debugger or the reloader, and
    quiet: one line with the URL (in place of Dash's "Dash is running", Flask's banner and
    Werkzeug's development-server warning), no line per request; warnings and errors still log."""
    from werkzeug.serving import make_server

    http = make_server(host, port, app.server, threaded=True)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    print(STARTED.format(url=url_of(host, http.server_port)), flush=True)
    try:
        http.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        http.server_close()


@functools.lru_cache(maxsize=1)
def server_from_environment():
    """The Flask server for `gunicorn app:server`, configured from DASHBOARD_* variables."""
    return create_app(options_from_environment()).server
